"""Simulation: Hypothesis drives random interleavings of every call against the
database and against a pure-Python model of the books (tests/model.py), and
after every step the two must agree and ``llm.check_invariants()`` must be
empty (invariants 1-9 of docs/contract.md "Invariants").

The price book: one model has a price; admissions of it come with token
counts and no estimate, settle_usage prices a usage at the pinned price (LL014 for a
request whose model has none), also late (a priced true-up, a usage kept for audit);
after every step each period's cost, each task's priced nanos and each request's cost
equal the model's.

Three organizations: a small allowance (whose allowance is raised and
lowered, also while an admission waits for it), an unlimited one, and one that
gets suspended and reactivated; each starts with its own recovery-charge and
late-settlement policy and its own number of period stripes (the small allowance
over 4, so its admissions often need the exact path), which the steps change;
admissions also come from other sessions, so holds land on several stripes. The
steps: admit (with or without a task, a retried id, a foreign task), dispatch,
settle (also late, after recovery, and for the wrong organization), fail,
open (with replay keys, unknown task kinds) and close tasks, reconcile one
organization, run the whole pass, claim / complete / fail notices, and move
the clock (minutes to days, across month boundaries). Budgets: every
organization starts with an API key '*' and an end user's own day budget,
set_budget sets, changes and removes others (organization day/week, project,
key and end user), and admissions name scope ids; the model decides each
admission on the allowance, then on every budget that applies in bit order.

After every step: each period's allowance, used, held and cents; each
request's status, settlement kind, charge, period, task, past-window alert,
late audit record, scope ids and budget_mask; each budget counter's used, held
and cents (invariant 14); each task's status, totals, end and duration; each notice
per threshold with its status and attempts; daily usage; no drift findings;
``check_invariants()`` empty.

One database for the whole run, emptied between examples (DELETE in
foreign-key order: much faster than a clone per example). Examples: 500, or
``LLM_DB_SIM_EXAMPLES``; derandomized, so CI runs the same examples.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import psycopg
from concurrent_model import request_scopes_sql
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from model import PRICED_MODEL, Books, Rejected, period_of, priced_credits

from tests.helpers import CLEAN_BOOKS, T0, call, call_pass, declare_task, invariants, wait_blocked

EXAMPLES = int(os.environ.get("LLM_DB_SIM_EXAMPLES", "500"))
STEPS = 15

ORG_SMALL = uuid.UUID("00000000-0000-4000-8000-000000005001")
ORG_UNLIMITED = uuid.UUID("00000000-0000-4000-8000-000000005002")
ORG_SUSPENDED = uuid.UUID("00000000-0000-4000-8000-000000005003")
ORGS = (ORG_SMALL, ORG_UNLIMITED, ORG_SUSPENDED)
SETUP = {  # allowance, thresholds
    ORG_SMALL: (100, (50, 80, 100)),
    ORG_UNLIMITED: (None, (80, 100)),
    ORG_SUSPENDED: (1000, (80, 100)),
}
STRIPES = {ORG_SMALL: 4, ORG_UNLIMITED: 2, ORG_SUSPENDED: 1}  # at the start (set_period_stripes changes them)
POLICIES = {  # recovery_charge, late_settlement at the start (set_recovery_policy changes them)
    ORG_SMALL: ("estimate", "true_up"),
    ORG_UNLIMITED: ("dispatched", "true_up"),
    ORG_SUSPENDED: ("none", "audit"),
}
TASK_KINDS = ("sim.summarize", "sim.translate")
START = T0 + timedelta(days=15, hours=8)  # the 30th, 20:00: close to a month boundary

picks = st.integers(min_value=0, max_value=10_000)
# round amounts land exactly on thresholds (50 % of 100, 80 % of 1000 …) as often as not
estimates = st.sampled_from([10, 20, 30, 50]) | st.integers(0, 70)
charges = st.sampled_from([0, 10, 20, 30, 50, 80]) | st.integers(0, 120)
rare = st.integers(min_value=0, max_value=7).map(lambda n: n == 0)  # true one time in eight
# budgets: the scope ids a request names (project, api_key, end_user), and the
# budgets set_budget sets or removes; no thresholds (the concurrent simulation checks
# budget notices), so the notices here stay the allowance's
scope_ids = st.tuples(st.sampled_from([None, "p-1"]), st.sampled_from([None, "k-1", "k-2"]),
                      st.sampled_from([None, "u-1", "u-2"]))  # fmt: skip
SETUP_BUDGETS = (("api_key", "*", "day", 60), ("end_user", "u-1", "day", 40))  # on every organization
BUDGETS = (("organization", None, "day"), ("organization", None, "week"), ("project", "p-1", "month"),
           ("project", "*", "day"), ("api_key", "k-1", "day"), ("api_key", "*", "week"),
           ("end_user", "*", "day"), ("end_user", "u-1", "month"))  # fmt: skip


SESSIONS = range(3)  # more sessions that admit, so striped holds land on several stripes


class BooksMachine(RuleBasedStateMachine):
    conn: psycopg.Connection  # set by the test
    connect: Callable[..., psycopg.Connection]  # more connections (llm_connect), for races
    other: psycopg.Connection | None = None
    sessions: list[psycopg.Connection] = []
    steps_run = 0
    examples_run = 0
    outcomes: Counter = Counter()  # SQLSTATE (or ok) of every call, for the summary
    tally: Counter = Counter()  # what the examples built, for the summary

    def __init__(self) -> None:
        super().__init__()
        for statement in CLEAN_BOOKS:
            self.conn.execute(statement)
        for key in TASK_KINDS:
            declare_task(self.conn, key)
        self.now = START
        self.counter = 0
        self.books = Books(task_kinds=set(TASK_KINDS))
        self.claim_tokens: dict = {}  # each notice's latest claim token
        # the price book: one model priced, kept between examples (versions never
        # change; setting the same rates at the same time adds none)
        self._call("set_price", PRICED_MODEL, {"input": "3", "output": "15"}, effective_from=START - timedelta(days=60))
        self._call("set_credit_rate", 1000, effective_from=START - timedelta(days=60))
        for org, (allowance, thresholds) in SETUP.items():
            self._upsert(org, allowance, "operational", thresholds)
            self._call("set_recovery_policy", org, *POLICIES[org])
            self.books.set_recovery_policy(org, *POLICIES[org])
            self._call("set_period_stripes", org, STRIPES[org])
            for scope, scope_id, window, limit in SETUP_BUDGETS:
                self._call("set_budget", org, scope, scope_id, window, limit, thresholds=[], now=self.now)
                self.books.set_budget(org, scope, scope_id, window, limit)
        BooksMachine.examples_run += 1

    # ------------------------------------------------------------ plumbing

    def _both(self, db_call, model_call):
        """Run the call on the database, then on the model (given the database's
        answer, for ids it generates); both must fail with the same SQLSTATE or
        both succeed. Returns (database answer, model answer)."""
        BooksMachine.steps_run += 1
        try:
            answer, code = db_call(), None
        except psycopg.Error as exc:
            answer, code = None, exc.sqlstate
        try:
            expected, expected_code = model_call(answer), None
        except Rejected as rejected:
            expected, expected_code = None, rejected.code
        assert code == expected_code, f"database raised {code}, the model expected {expected_code}"
        BooksMachine.outcomes[code or "ok"] += 1
        return answer, expected

    def _call(self, operation: str, *args, conn: psycopg.Connection | None = None, **kwargs) -> dict:
        """The first row of one operation of the driver's table, on ``conn`` (default: ours)."""
        return call(conn or self.conn, operation, *args, **kwargs)[0]

    def _value(self, operation: str, *args, **kwargs):
        return self._call(operation, *args, **kwargs)["value"]

    def _db_upsert(self, org, allowance, status, thresholds, conn: psycopg.Connection | None = None) -> None:
        self._call("upsert_organization", org, f"org {org}", allowance, status=status,
                   notice_thresholds=list(thresholds), now=self.now, conn=conn)

    def _upsert(self, org, allowance, status, thresholds) -> None:
        self._db_upsert(org, allowance, status, thresholds)
        self.books.upsert_organization(org, allowance, status, thresholds, self.now)

    def _admit(self, org, estimate, model, execution, inv, conn: psycopg.Connection | None = None,
               ids: tuple = (None, None, None), tokens: tuple | None = None):  # fmt: skip
        """Admit on the database and the model; the database's answer is the request's id.
        ``tokens`` (input, most output): a priced admission, with no estimate."""
        project, api_key, end_user = ids
        priced = {} if tokens is None else {"input_tokens": tokens[0], "max_output_tokens": tokens[1]}

        def admitted(_):
            row = self.books.admit(org, estimate if tokens is None else priced_credits(*tokens), model,
                                   execution, inv, self.now, ids)
            row.tokens = row.tokens if row.tokens is not None else tokens
            return row

        self._both(
            lambda: self._value("admit_id", org, None if tokens else estimate, model, execution_id=execution,
                                invocation_id=inv, now=self.now, conn=conn, project=project, api_key=api_key,
                                end_user=end_user, **priced),
            admitted,
        )

    def _settle(self, org, inv, credits, cents, tokens) -> None:
        db, expected = self._both(
            lambda: self._value("settle", org, inv, credits, cents, input_tokens=tokens, output_tokens=tokens,
                                now=self.now),
            lambda _: self.books.settle(org, inv, credits, cents, tokens, tokens, self.now),
        )
        assert db is None or db == expected

    def _pick(self, items: list, pick: int):
        return items[pick % len(items)] if items else None

    def _invocations(self) -> list:
        return sorted(self.books.invocations)

    def _executions(self) -> list:
        # in opening order: the database makes up the ids, so sorting by them would
        # make the same example pick different tasks from one run to the next
        return list(self.books.executions)

    # ------------------------------------------------------------ requests

    @rule(o=st.integers(0, 2), estimate=estimates, with_task=st.booleans(), p=picks,
          foreign=rare, model=st.sampled_from(["m-1", "m-2", PRICED_MODEL]), ids=scope_ids)  # fmt: skip
    def admit(self, o, estimate, with_task, p, foreign, model, ids=(None, None, None)):
        org = ORGS[o]
        execution = None
        if with_task:
            tasks = [t for t in self._executions() if (t[0] != org) == foreign]
            chosen = self._pick(tasks, p)
            execution = chosen[1] if chosen else None
        self.counter += 1
        self._admit(org, estimate, model, execution, uuid.UUID(int=(1 << 96) + self.counter), ids=ids)

    @rule(estimate=estimates, p=picks, ids=scope_ids)
    def admit_small(self, estimate, p, ids):
        """More admissions for the small allowance: LL001 and overage are reached often."""
        self.admit(0, estimate, with_task=p % 2 == 0, p=p, foreign=False, model="m-1", ids=ids)

    @rule(o=st.integers(0, 2), estimate=estimates, session=st.integers(0, len(SESSIONS) - 1))
    def admit_from_another_session(self, o, estimate, session):
        """An admission from another session (another backend), so a striped organization's
        holds land on other stripes (a session holds on stripe pid % N)."""
        self.counter += 1
        self._admit(ORGS[o], estimate, "m-2", None, uuid.UUID(int=(1 << 96) + self.counter),
                    conn=BooksMachine.sessions[session])

    @precondition(lambda self: self.books.invocations)
    @rule(p=picks, same=st.booleans())
    def admit_again(self, p, same):
        """A retried id: the same arguments return the first admission, others LL007 (a
        priced one: the same tokens, or one more output token)."""
        org, inv = self._pick(self._invocations(), p)
        row = self.books.invocations[(org, inv)]
        if row.tokens is not None:
            tokens = row.tokens if same else (row.tokens[0], row.tokens[1] + 1)
            self._admit(org, None, row.model, row.execution, inv, ids=row.ids, tokens=tokens)
            return
        estimate = row.estimate if same else row.estimate + 1
        self._admit(org, estimate, row.model, row.execution, inv, ids=row.ids)

    @rule(o=st.integers(0, 2), input_tokens=st.integers(0, 12), max_output=st.integers(0, 3),
          with_task=st.booleans(), p=picks, ids=scope_ids)  # fmt: skip
    def admit_priced(self, o, input_tokens, max_output, with_task, p, ids):
        """The price book: an admission with token counts and no estimate,
        which the book prices at the price in force (and pins)."""
        org = ORGS[o]
        tasks = [t for t in self._executions() if t[0] == org] if with_task else []
        chosen = self._pick(tasks, p)
        self.counter += 1
        self._admit(org, None, PRICED_MODEL, chosen[1] if chosen else None,
                    uuid.UUID(int=(1 << 96) + self.counter), ids=ids, tokens=(input_tokens, max_output))

    def _priced(self, recovered: bool = False) -> list:
        """The requests of the priced model (each pinned its price, whatever its estimate's source)."""
        return [k for k in self._invocations() if self.books.invocations[k].model == PRICED_MODEL
                and (not recovered or self.books.invocations[k].kind == "recovered")]  # fmt: skip

    @precondition(lambda self: self._priced())
    @rule(p=picks, input_tokens=st.integers(0, 15), output=st.integers(0, 5), foreign=rare, unpriced=rare)
    def settle_usage(self, p, input_tokens, output, foreign, unpriced):
        """settle_usage with the provider's usage, of a priced request (open, or terminal:
        a retry, a late report): priced at the pinned price; LL007 for a retry with other
        figures; LL014 for a request whose model had no price (``unpriced``)."""
        self._settle_usage(self._pick(self._invocations() if unpriced else self._priced(), p),
                           input_tokens, output, foreign)

    @precondition(lambda self: self._priced(recovered=True))
    @rule(p=picks, input_tokens=st.integers(0, 15), output=st.integers(0, 5))
    def settle_usage_late(self, p, input_tokens, output):
        """The late usage of a recovered priced request: trued up at the pinned price, or
        kept for audit (BR-CAP-PFM-LLM-009-01: recovery charged the estimate, no cost)."""
        self._settle_usage(self._pick(self._priced(recovered=True), p), input_tokens, output, False)

    def _settle_usage(self, key: tuple, input_tokens: int, output: int, foreign: bool) -> None:
        org, inv = key
        if foreign:
            org = ORGS[(ORGS.index(org) + 1) % len(ORGS)]
        db, expected = self._both(
            lambda: self._value("settle_usage", org, inv, {"input": input_tokens, "output": output}, now=self.now),
            lambda _: self.books.settle_usage(org, inv, input_tokens, output, self.now),
        )
        assert db is None or db == expected

    @precondition(lambda self: self.books.invocations)
    @rule(p=picks)
    def dispatch(self, p):
        org, inv = self._pick(self._invocations(), p)
        self._both(
            lambda: self._call("mark_dispatched", org, inv, now=self.now),
            lambda _: self.books.mark_dispatched(org, inv, self.now),
        )

    @precondition(lambda self: self.books.invocations)
    @rule(p=picks, credits=charges, cents=st.integers(0, 30),
          tokens=st.none() | st.integers(0, 5000), foreign=rare)  # fmt: skip
    def settle(self, p, credits, cents, tokens, foreign):
        org, inv = self._pick(self._invocations(), p)
        if foreign:  # another organization's request is unknown here: LL005
            org = ORGS[(ORGS.index(org) + 1) % len(ORGS)]
        self._settle(org, inv, credits, cents, tokens)

    @precondition(lambda self: self.books.invocations)
    @rule(p=picks, credits=st.sampled_from([0, 0, 3, 40]), cents=st.integers(0, 5))
    def fail(self, p, credits, cents):
        org, inv = self._pick(self._invocations(), p)
        db, expected = self._both(
            lambda: self._value("fail", org, inv, "provider error", credits=credits, cents=cents, now=self.now),
            lambda _: self.books.fail(org, inv, credits, cents, self.now),
        )
        assert db is None or db == expected

    @rule(o=st.integers(0, 2), budget=st.sampled_from(BUDGETS), limit=st.sampled_from([20, 50, 100, None]))
    def set_budget(self, o, budget, limit):
        """A budget set, changed or removed; it applies to the next admission."""
        org = ORGS[o]
        self._both(
            lambda: self._call("set_budget", org, *budget, limit, thresholds=[], now=self.now),
            lambda _: self.books.set_budget(org, *budget, limit),
        )

    # ------------------------------------------------------------ tasks

    @rule(o=st.integers(0, 2), task=st.sampled_from([*TASK_KINDS, *TASK_KINDS, "sim.undeclared"]),
          subject=st.sampled_from([None, "doc-1"]), replay=st.sampled_from([None, None, "r-1", "r-2"]))  # fmt: skip
    def open_task(self, o, task, subject, replay):
        org = ORGS[o]
        def open_execution() -> tuple:
            r = self._call("open_execution", org, task, subject_type="document", subject_id=subject,
                           replay_key=replay, now=self.now)
            return r["execution_id"], r["status"], r["replayed"]

        db, expected = self._both(
            open_execution,
            lambda db: self.books.open_execution(
                org, task, subject, replay, self.now, db[0] if db and not db[2] else None
            ),
        )
        assert db is None or tuple(db) == expected

    @precondition(lambda self: self.books.executions)
    @rule(p=picks, outcome=st.sampled_from(["completed", "failed", "completed", "abandoned"]), foreign=rare)
    def close_task(self, p, outcome, foreign):
        org, execution = self._pick(self._executions(), p)
        if foreign:
            org = ORGS[(ORGS.index(org) + 1) % len(ORGS)]
        db, expected = self._both(
            lambda: self._value("close_execution", org, execution, outcome, now=self.now),
            lambda _: self.books.close_execution(org, execution, outcome, self.now),
        )
        assert db is None or db == expected

    # ------------------------------------------------------------ recovery, clock, tenants

    @rule(o=st.integers(0, 2))
    def reconcile_org(self, o):
        org = ORGS[o]
        db, expected = self._both(
            lambda: self._call("reconcile_org", org, now=self.now),
            lambda _: self.books.reconcile_org(org, self.now),
        )
        assert db is None or (db["recovered_requests"], db["abandoned_executions"], db["more_pending"]) == (
            *expected, False)

    @rule()
    def run_pass(self):
        self._both(
            lambda: call_pass(self.conn, self.now),
            lambda _: self.books.run_reconciliation(self.now),
        )
        status, errors = self.conn.execute(
            "SELECT status, errors FROM llm.reconciliation_runs ORDER BY started_at DESC LIMIT 1"
        ).fetchone()
        assert (status, errors) == ("succeeded", [])

    @rule()
    def window_passes(self):
        """The recovery window elapses and the hourly pass runs: stranded work is recovered."""
        self.move_clock(timedelta(hours=25))
        self.run_pass()

    @rule(delta=st.sampled_from([timedelta(minutes=1), timedelta(minutes=20), timedelta(hours=2),
                                 timedelta(hours=13), timedelta(hours=25), timedelta(days=6)]))  # fmt: skip
    def move_clock(self, delta):
        BooksMachine.steps_run += 1
        self.now += delta

    @rule(status=st.sampled_from(["suspended", "operational"]))
    def suspend_or_reactivate(self, status):
        BooksMachine.steps_run += 1
        allowance, thresholds = SETUP[ORG_SUSPENDED]
        self._upsert(ORG_SUSPENDED, allowance, status, thresholds)

    @rule(allowance=st.sampled_from([40, 100, 160]))
    def change_allowance(self, allowance):
        """Raised or lowered: applies to the current period at once."""
        BooksMachine.steps_run += 1
        self._upsert(ORG_SMALL, allowance, "operational", SETUP[ORG_SMALL][1])

    @rule(allowance=st.sampled_from([40, 100, 160]), estimate=estimates,
          next_month=st.booleans())  # fmt: skip
    def change_allowance_racing_an_admission(self, allowance, estimate, next_month):
        """Invariant 9: an upsert_organization is open (uncommitted) on another connection
        when an admission of the small organization starts (often the first of a new
        month, which creates the period); the upsert commits while the admission waits.
        The books equal the model's: the upsert first, then the admission."""
        if next_month:  # the first admission of the next month
            self.now = datetime(self.now.year + self.now.month // 12, self.now.month % 12 + 1, 1, 0, 5,
                                tzinfo=UTC)  # fmt: skip
        BooksMachine.tally["allowance races"] += 1
        if BooksMachine.other is None or BooksMachine.other.closed:
            BooksMachine.other = BooksMachine.connect(autocommit=False)
        other = BooksMachine.other
        self._db_upsert(ORG_SMALL, allowance, "operational", SETUP[ORG_SMALL][1], conn=other)
        self.counter += 1
        inv = uuid.UUID(int=(1 << 96) + self.counter)
        outcome: dict[str, object] = {}

        def admit() -> None:
            try:
                outcome["row"] = self._value("admit_id", ORG_SMALL, estimate, "m-1", invocation_id=inv,
                                             now=self.now)
            except psycopg.Error as exc:
                outcome["code"] = exc.sqlstate

        # The admission waits for the upsert when it creates the month's period or when
        # the upsert moves the allowance (below); else they share no row and it may not.
        must_wait = ((ORG_SMALL, period_of(self.now)) not in self.books.periods
                     or self.books.orgs[ORG_SMALL].allowance != allowance)  # fmt: skip
        worker = threading.Thread(target=admit)
        worker.start()
        try:
            if must_wait:
                with BooksMachine.connect() as observer:
                    wait_blocked(observer, self.conn.info.backend_pid, by=other.info.backend_pid)
                BooksMachine.tally["admissions that waited"] += 1
        finally:
            other.commit()
        worker.join(30)
        assert not worker.is_alive()
        # The two serialize upsert first: the month's first admission waits for the
        # organization's row (it creates the period under its share lock); into an existing
        # period, the upsert that moves the allowance holds every stripe of the period, so
        # the admission waits for it either way (on its stripe, or taking the exact path)
        # and is decided on the new allowance.
        self.books.upsert_organization(ORG_SMALL, allowance, "operational", SETUP[ORG_SMALL][1], self.now)
        self._both(lambda: outcome.get("row") if "code" not in outcome else _raise(outcome["code"]),
                   lambda _: self.books.admit(ORG_SMALL, estimate, "m-1", None, inv, self.now))  # fmt: skip

    @rule(o=st.integers(0, 2), charge=st.sampled_from(["estimate", "dispatched", "none", "half"]),
          late=st.sampled_from(["audit", "true_up", "true_up", "later"]))  # fmt: skip
    def set_recovery_policy(self, o, charge, late):
        """What recovery charges and what a late settlement does (22023 for another word)."""
        org = ORGS[o]
        self._both(
            lambda: self._call("set_recovery_policy", org, charge, late),
            lambda _: self.books.set_recovery_policy(org, charge, late),
        )

    @rule(o=st.integers(0, 2), stripes=st.sampled_from([1, 2, 3, 8, 64, 0, 65]))
    def set_period_stripes(self, o, stripes):
        """The period counters spread over 1 to 64 rows (22023 outside): from the next
        admission on, with every hold kept; the books stay exact."""
        org = ORGS[o]
        db, expected = self._both(
            lambda: self._value("set_period_stripes", org, stripes),
            lambda _: self.books.set_period_stripes(org, stripes),
        )
        assert db is None or db == expected
        BooksMachine.tally["stripe changes"] += db is not None

    @precondition(lambda self: any(r.kind == "recovered" for r in self.books.invocations.values()))
    @rule(p=picks, credits=charges, cents=st.integers(0, 30), tokens=st.none() | st.integers(0, 5000))
    def settle_late(self, p, credits, cents, tokens):
        """A worker comes back after recovery: audited or trued up, per the policy in force."""
        recovered = sorted(k for k, r in self.books.invocations.items() if r.kind == "recovered")
        org, inv = self._pick(recovered, p)
        self._settle(org, inv, credits, cents, tokens)

    # ------------------------------------------------------------ notices

    def _notice_id(self, key) -> uuid.UUID:
        org, start, pct = key
        (notice,) = self.conn.execute(
            "SELECT id FROM llm.threshold_notices WHERE organization_id = %s AND period_start = %s AND threshold_pct = %s",
            [org, start, pct],
        ).fetchone()
        return notice

    def _claim(self) -> list:
        claimed = call(self.conn, "claim_notices", limit=50, now=self.now)
        for n in claimed:
            self.claim_tokens[(n["organization_id"], n["period_start"], n["threshold_pct"])] = n["claim_token"]
        return [(n["organization_id"], n["period_start"], n["threshold_pct"]) for n in claimed]

    @rule()
    def claim_notices(self):
        db, expected = self._both(self._claim, lambda _: self.books.claim_notices(50, self.now))
        assert sorted(db) == sorted(expected)

    @precondition(lambda self: self.books.notices)
    @rule(p=picks, delivered=st.booleans())
    def complete_or_fail_notice(self, p, delivered):
        key = self._pick(sorted(self.books.notices), p)
        notice = self._notice_id(key)
        # the latest claim's token (live while the notice is sending), or one no claim had
        token = self.claim_tokens.get(key) or uuid.uuid4()
        if delivered:
            db, expected = self._both(
                lambda: self._value("complete_notice", key[0], notice, token, now=self.now),
                lambda _: self.books.complete_notice(key),
            )
        else:
            db, expected = self._both(
                lambda: self._value("fail_notice", key[0], notice, token, "webhook returned 503", now=self.now),
                lambda _: self.books.fail_notice(key, self.now),
            )
        assert db == expected

    def teardown(self):
        books = self.books
        tally = BooksMachine.tally
        tally["invocations"] += len(books.invocations)
        tally["recovered"] += sum(r.kind in ("recovered", "trued_up") for r in books.invocations.values())
        tally["recovered uncharged"] += sum(r.recovered == 0 and r.estimate > 0 for r in books.invocations.values())
        tally["trued up"] += sum(r.kind == "trued_up" for r in books.invocations.values())
        tally["priced admissions"] += sum(r.tokens is not None for r in books.invocations.values())
        tally["priced by the book"] += sum(r.cost is not None for r in books.invocations.values())
        tally["priced true-ups"] += sum(r.cost is not None and r.kind == "trued_up" for r in books.invocations.values())
        tally["late settlements"] += sum(r.late for r in books.invocations.values())
        tally["tasks"] += len(books.executions)
        tally["abandoned"] += sum(e.status == "abandoned" for e in books.executions.values())
        tally["notices"] += len(books.notices)
        tally["periods"] += len(books.periods)
        tally["stripes used"] += self.conn.execute(
            "SELECT count(DISTINCT (organization_id, period_start, stripe)) FROM llm.invocations").fetchone()[0]
        tally["passes"] += books.passes

    # ------------------------------------------------------------ after every step

    def _keyed(self, query: str, key_columns: int) -> dict:
        """The rows of ``query`` keyed by their first ``key_columns`` columns, the rest a tuple."""
        return {tuple(r[:key_columns]): tuple(r[key_columns:]) for r in self.conn.execute(query)}

    @invariant()
    def books_agree_with_the_model(self):
        books = self.books
        for key_columns, query, expected in (
            (2, "SELECT organization_id, period_start, allowance_credits, used_credits, held_credits, used_cents"
                " FROM llm.periods", books.expected_periods()),
            (2, "SELECT organization_id, id, status, settlement_kind, charged_credits, charged_cents, period_start,"
                " execution_id, past_window_alerted_at IS NOT NULL, late_reported_at IS NOT NULL,"
                " recovered_credits FROM llm.invocations", {k: v[:-4] for k, v in books.expected_invocations().items()}),
            (2, request_scopes_sql(self.conn), {k: v[-4:] for k, v in books.expected_invocations().items()}),
            (5, "SELECT organization_id, scope, scope_id, budget_window, window_start, used_credits, held_credits,"
                " used_cents FROM llm.budget_counters", books.expected_counters()),
            (2, "SELECT organization_id, id, status, request_count, credits, cents, ended_at, duration_ms"
                " FROM llm.executions", books.expected_executions()),
            (3, "SELECT organization_id, period_start, threshold_pct, status, attempts FROM llm.threshold_notices",
             books.expected_notices()),
            (3, "SELECT organization_id, day, model, requests, recovered_requests, credits, cents,"
                " input_tokens, output_tokens FROM llm.daily_usage", books.daily),
        ):
            assert self._keyed(query, key_columns) == expected, query
        costs = books.expected_costs()  # the price book: cost beside the credits
        for key_columns, query, expected in (
            (2, "SELECT organization_id, period_start, used_cost_nanos FROM llm.periods", costs["periods"]),
            (2, "SELECT organization_id, id, coalesce(priced_nanos, 0) FROM llm.executions", costs["tasks"]),
            (2, "SELECT organization_id, id, cost_nanos FROM llm.invocations", costs["requests"]),
        ):
            assert self._keyed(query, key_columns) == expected, query
        q = self.conn.execute
        assert q("SELECT count(*) FROM llm.drift_findings").fetchone() == (0,)
        assert q("SELECT count(*) FROM llm.period_findings").fetchone() == (0,)
        assert invariants(self.conn) == []


def _raise(sqlstate: str) -> None:
    """Re-raise a SQLSTATE caught in another thread, for ``_both``."""
    error = psycopg.Error(sqlstate)
    error.sqlstate = sqlstate  # type: ignore[misc]
    raise error


def test_random_interleavings_keep_the_books_equal_to_the_model(llm_conn, llm_connect, capsys):
    """Invariants 1-9 and the model after every step of random interleavings
    (CAP-PFM-LLM-007 admission, WF-PFM-LLM-002 tasks, WF-PFM-LLM-004 recovery with its
    recovery-charge policy and late true-ups, allowance changes racing admissions), and
    budgets (invariants 14 and 15): admissions decided on every budget that
    applies, counters moved by every movement."""
    llm_conn.execute("SET lock_timeout = '5s'")
    BooksMachine.conn = llm_conn
    BooksMachine.connect = llm_connect
    BooksMachine.other = None
    BooksMachine.sessions = [llm_connect() for _ in SESSIONS]
    BooksMachine.steps_run = BooksMachine.examples_run = 0
    BooksMachine.outcomes = Counter()
    BooksMachine.tally = Counter()
    run_state_machine_as_test(
        BooksMachine,
        settings=settings(
            max_examples=EXAMPLES,
            stateful_step_count=STEPS,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
    with capsys.disabled():
        print(
            f"\n[simulation] {BooksMachine.examples_run} examples, {BooksMachine.steps_run} steps "
            f"checked against the model and check_invariants(); call outcomes "
            f"{dict(sorted(BooksMachine.outcomes.items()))}; built {dict(BooksMachine.tally)}"
        )
    assert BooksMachine.steps_run >= EXAMPLES
