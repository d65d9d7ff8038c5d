"""A small pure-Python model of the books, for the simulation (test_simulation.py).

It follows docs/contract.md, not the SQL: what each call must do to periods,
invocations, tasks, notices and daily usage, and which SQLSTATE a call must
raise. Every method either raises ``Rejected(code)`` before changing anything
(a rejected call writes nothing) or applies the whole change (one transaction).
The simulation runs the same call against the database and compares.

Deliberately small: one organization table, one clock, no batches (the
simulation never leaves more than ``sweep_batch`` requests stranded).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta

RECOVERY_WINDOW = timedelta(hours=24)
NOTICE_CLAIM_TIMEOUT = timedelta(minutes=15)
NOTICE_BACKOFF_BASE = timedelta(minutes=1)
NOTICE_BACKOFF_MAX = timedelta(hours=6)
REPORTING_DAYS = 2
OPEN = ("reserved", "dispatched")


SCOPES = ("organization", "project", "api_key", "end_user")  # budget bit 3 * scope + window

# The price book: one model with a price, $3 and $15 a million input and output
# tokens (3,000 and 15,000 nanos a token), a credit worth 1,000 nanos; the others have none.
PRICED_MODEL = "m-p"
INPUT_NANOS, OUTPUT_NANOS, NANOS_PER_CREDIT = 3_000, 15_000, 1_000


def priced_credits(input_tokens: int, output_tokens: int) -> int:
    """What tokens of PRICED_MODEL cost in credits (ceil(cost / nanos per credit), exact here)."""
    return -(-(input_tokens * INPUT_NANOS + output_tokens * OUTPUT_NANOS) // NANOS_PER_CREDIT)
WINDOWS = ("day", "week", "month")


def window_start(window: str, at: datetime) -> date:
    """The first day of the UTC calendar window (day, week from Monday, month) containing ``at``."""
    day = at.astimezone(UTC).date()
    if window == "week":
        return day - timedelta(days=day.weekday())
    return day.replace(day=1) if window == "month" else day


class Rejected(Exception):
    """The call must fail with this SQLSTATE and change nothing."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


def period_of(at: datetime) -> date:
    """The UTC calendar month containing ``at`` (its first day)."""
    return date(at.year, at.month, 1)  # the simulation's clock is in UTC


@dataclass
class Org:
    id: uuid.UUID
    status: str
    allowance: int | None  # None: unlimited
    thresholds: tuple[int, ...]
    recovery_charge: str = "estimate"  # estimate | dispatched | none
    late_settlement: str = "audit"  # audit | true_up


@dataclass
class Period:
    allowance: int | None
    used: int = 0
    held: int = 0
    cents: int = 0


@dataclass
class Invocation:
    id: uuid.UUID
    org: uuid.UUID
    period: date
    execution: uuid.UUID | None
    model: str
    estimate: int
    created_at: datetime
    status: str = "reserved"
    kind: str | None = None  # settlement_kind: measured | recovered | trued_up
    charged: int | None = None
    cents: int | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    settled_at: datetime | None = None
    alerted: bool = False  # past_window_alerted_at is set
    late: bool = False  # a late settlement or failure was recorded (audit) or trued up
    # the figures of its stored measured settlement (charged, or kept for audit): a repeat
    # with others is LL007; None when none is stored or it ended by a failure
    report: tuple | None = None
    recovered: int | None = None  # what recovery charged (kept after a true-up)
    ids: tuple[str | None, ...] = (None, None, None)  # project, api_key, end_user
    mask: int = 0  # budget_mask: the budget counters it moves, fixed at admission
    cost: int | None = None  # cost_nanos: what the book priced its usage at (None: not priced by it)
    report_usage: tuple | None = None  # the usage its charged settlement was priced from
    tokens: tuple | None = None  # a priced admission's (input tokens, most output tokens)


@dataclass
class Execution:
    id: uuid.UUID
    org: uuid.UUID
    task: str
    subject: str | None
    replay_key: str | None
    started_at: datetime
    status: str = "running"
    ended_at: datetime | None = None
    requests: int = 0
    credits: int = 0
    cents: int = 0


@dataclass
class NoticeDelivery:
    """Where a threshold notice stands in its delivery (both simulations' models)."""

    status: str = "owed"
    attempts: int = 0
    next_attempt_at: datetime | None = None
    claimed_at: datetime | None = None


@dataclass
class Notice(NoticeDelivery):
    crossed_at: datetime | None = None


@dataclass
class Books:
    task_kinds: set[str]
    orgs: dict[uuid.UUID, Org] = field(default_factory=dict)
    periods: dict[tuple[uuid.UUID, date], Period] = field(default_factory=dict)
    invocations: dict[tuple[uuid.UUID, uuid.UUID], Invocation] = field(default_factory=dict)
    executions: dict[tuple[uuid.UUID, uuid.UUID], Execution] = field(default_factory=dict)
    notices: dict[tuple[uuid.UUID, date, int], Notice] = field(default_factory=dict)
    daily: dict[tuple[uuid.UUID, date, str], tuple[int, ...]] = field(default_factory=dict)
    passes: int = 0
    rebuilt_through: date | None = None  # the day of the last pass that rebuilt every day it owed
    # budgets: (org, scope, scope id or '*' or None, window) -> limit
    budgets: dict[tuple, int] = field(default_factory=dict)

    # ------------------------------------------------------------ organizations

    def upsert_organization(
        self, org: uuid.UUID, allowance: int | None, status: str, thresholds: tuple[int, ...], now: datetime
    ) -> None:
        old = self.orgs.get(org)
        row = Org(org, status, allowance, tuple(sorted(set(thresholds))))
        if old is not None:
            row.recovery_charge, row.late_settlement = old.recovery_charge, old.late_settlement
        self.orgs[org] = row
        if old is not None and (old.allowance, old.thresholds) != (allowance, row.thresholds):
            # a changed allowance applies to the current period at once (and to any later
            # one a moved clock opened): invariant 9; there the change itself owes every
            # threshold the usage now stands at or above
            for (tenant, start), period in self.periods.items():
                if tenant == org and start >= period_of(now):
                    period.allowance = allowance
                    self._reached(org, start, now)

    def set_period_stripes(self, org: uuid.UUID, stripes: int) -> int:
        """Spreads the counters over more rows: nothing the books show changes (the
        database checks its stripes with check_invariants)."""
        if not 1 <= stripes <= 64:
            raise Rejected("22023")
        if org not in self.orgs:
            raise Rejected("LL002")
        return stripes

    def set_recovery_policy(self, org: uuid.UUID, recovery_charge: str, late_settlement: str) -> None:
        if recovery_charge not in ("estimate", "dispatched", "none"):
            raise Rejected("22023")
        if late_settlement not in ("audit", "true_up"):
            raise Rejected("22023")
        if org not in self.orgs:
            raise Rejected("LL002")
        self.orgs[org].recovery_charge = recovery_charge
        self.orgs[org].late_settlement = late_settlement

    def _operational(self, org: uuid.UUID) -> Org:
        if org not in self.orgs:
            raise Rejected("LL002")
        if self.orgs[org].status != "operational":
            raise Rejected("LL003")
        return self.orgs[org]

    def _invocation(self, org: uuid.UUID, inv: uuid.UUID) -> Invocation:
        if (org, inv) not in self.invocations:
            raise Rejected("LL005" if org in self.orgs else "LL002")
        return self.invocations[(org, inv)]

    # ------------------------------------------------------------ requests

    def admit(
        self, org: uuid.UUID, estimate: int, model: str, execution: uuid.UUID | None,
        inv: uuid.UUID, now: datetime, ids: tuple[str | None, ...] = (None, None, None),
    ) -> Invocation:  # fmt: skip
        tenant = self._operational(org)
        if execution is not None and (org, execution) not in self.executions:
            other = any(e == execution for (_, e) in self.executions)
            raise Rejected("LL008" if other else "LL006")
        existing = self.invocations.get((org, inv))
        if existing is not None:  # a retry: same arguments return the first admission
            if (existing.estimate, existing.model, existing.execution, existing.ids) != (
                estimate, model, execution, ids):  # fmt: skip
                raise Rejected("LL007")
            return existing
        if execution is not None and self.executions[(org, execution)].status != "running":
            raise Rejected("LL009")
        key = (org, period_of(now))
        period = self.periods.get(key) or Period(tenant.allowance)
        if period.allowance is not None and period.used + period.held + estimate > period.allowance:
            raise Rejected("LL001")  # the period row a first admission would create is rolled back too
        mask = self._hold_budgets(org, estimate, now, ids)
        self.periods[key] = period
        period.held += estimate
        row = Invocation(inv, org, key[1], execution, model, estimate, now, ids=ids, mask=mask)
        self.invocations[(org, inv)] = row
        return row

    # ------------------------------------------------------------ budgets

    def set_budget(self, org: uuid.UUID, scope: str, scope_id: str | None, window: str, limit: int | None) -> None:
        if org not in self.orgs:
            raise Rejected("LL002")
        if limit is None:
            self.budgets.pop((org, scope, scope_id, window), None)
        else:
            self.budgets[(org, scope, scope_id, window)] = limit

    def _hold_budgets(self, org: uuid.UUID, estimate: int, now: datetime, ids: tuple[str | None, ...]) -> int:
        """The admission's budget_mask; LL001 when a budget that applies does not fit: its
        own, else the scope's '*', per window, in bit order (nothing is held then)."""
        counters, mask = self.expected_counters(), 0
        for s, scope in enumerate(SCOPES):
            sid = None if scope == "organization" else ids[s - 1]
            if scope != "organization" and sid is None:
                continue
            for w, window in enumerate(WINDOWS):
                limit = self.budgets.get((org, scope, sid, window), self.budgets.get((org, scope, "*", window)))
                if limit is None or (scope, window) == ("organization", "month"):
                    continue
                used, held, _ = counters.get((org, scope, sid, window, window_start(window, now)), (0, 0, 0))
                if used + held + estimate > limit:
                    raise Rejected("LL001")
                mask |= 1 << (3 * s + w)
        return mask

    def expected_counters(self) -> dict:
        """Each budget counter's used, held and cents: the sums over its requests."""
        out: dict[tuple, tuple[int, int, int]] = {}
        for r in self.invocations.values():
            for s, scope in enumerate(SCOPES):
                for w, window in enumerate(WINDOWS):
                    if not r.mask & (1 << (3 * s + w)):
                        continue
                    key = (r.org, scope, None if s == 0 else r.ids[s - 1], window, window_start(window, r.created_at))
                    used, held, cents = out.get(key, (0, 0, 0))
                    if r.status in ("reserved", "dispatched"):
                        out[key] = (used, held + r.estimate, cents)
                    else:
                        out[key] = (used + r.charged, held, cents + (r.cents or 0))
        return out

    def mark_dispatched(self, org: uuid.UUID, inv: uuid.UUID, now: datetime) -> Invocation:
        row = self._invocation(org, inv)
        if row.status == "reserved":
            row.status = "dispatched"
        elif row.status != "dispatched":
            raise Rejected("LL009")
        return row

    def _true_up(self, row: Invocation, credits: int, cents: int | None, input_tokens: int | None,
                 output_tokens: int | None, now: datetime, usage: tuple | None = None) -> None:  # fmt: skip
        """The books move to the measured figures by the signed difference: the request's
        own period (a closed month too), its task, and its settlement day's daily usage."""
        diff = credits - row.recovered
        row.kind, row.charged, row.cents = "trued_up", credits, cents
        row.cost = None if usage is None else credits * NANOS_PER_CREDIT
        cents = cents or 0
        row.input_tokens, row.output_tokens = input_tokens, output_tokens
        if row.execution is not None:
            task = self.executions[(row.org, row.execution)]
            task.credits += diff
            task.cents += cents
        period = self.periods[(row.org, row.period)]
        old = period.used
        period.used += diff
        period.cents += cents
        if diff > 0:
            self._crossings(row.org, row.period, old, period.used, now)
        key = (row.org, row.settled_at.date(), row.model)
        if key in self.daily:
            n, recovered, day_credits, day_cents, tokens_in, tokens_out = self.daily[key]
            self.daily[key] = (n, recovered, day_credits + diff, day_cents + cents,
                               tokens_in + (input_tokens or 0), tokens_out + (output_tokens or 0))  # fmt: skip
        else:  # a day without the row gets it from the requests, this one included
            self.daily[key] = self._daily_row(key)

    def _already(self, row: Invocation) -> str:
        if row.status == "failed":
            return "already_failed"
        return "already_recovered" if row.kind == "recovered" else "already_settled"

    def _late(self, row: Invocation, credits: int, cents: int | None, input_tokens: int | None,
              output_tokens: int | None, now: datetime, usage: tuple | None = None) -> str:  # fmt: skip
        """A settlement or failure of a request no longer open: the first late report of a
        recovered request is recorded (audit) or trued up (true_up); the rest are retries."""
        outcome = self._already(row)
        if outcome != "already_recovered" or row.late:
            return outcome  # a late figure is recorded once: never trued up later
        row.late = True
        if self.orgs[row.org].late_settlement == "audit":
            return outcome  # recorded for audit, never charged
        self._true_up(row, credits, cents, input_tokens, output_tokens, now, usage)
        return "trued_up"

    def settle(
        self, org: uuid.UUID, inv: uuid.UUID, credits: int, cents: int | None,
        input_tokens: int | None, output_tokens: int | None, now: datetime,
    ) -> str:  # fmt: skip
        return self._settle(org, inv, credits, cents, input_tokens, output_tokens, now, None)

    def settle_usage(self, org: uuid.UUID, inv: uuid.UUID, input_tokens: int, output_tokens: int,
                     now: datetime) -> str:  # fmt: skip
        """settle_usage: the usage priced at the request's pinned price (LL014: none
        pinned, its model has no price), charged in credits with no cents."""
        row = self._invocation(org, inv)
        if row.model != PRICED_MODEL:
            raise Rejected("LL014")
        return self._settle(org, inv, priced_credits(input_tokens, output_tokens), None, input_tokens,
                            output_tokens, now, (input_tokens, output_tokens))

    def _settle(
        self, org: uuid.UUID, inv: uuid.UUID, credits: int, cents: int | None,
        input_tokens: int | None, output_tokens: int | None, now: datetime, usage: tuple | None,
    ) -> str:  # fmt: skip
        row = self._invocation(org, inv)
        given = (credits, cents, input_tokens, output_tokens)
        if row.status not in OPEN:
            if row.report is not None and (row.report != given or (
                    usage is not None and row.kind != "recovered" and row.report_usage != usage)):  # fmt: skip
                raise Rejected("LL007")  # a retry with other figures (a usage kept for audit: its figures)
            first_late = not row.late
            outcome = self._late(row, credits, cents, input_tokens, output_tokens, now, usage)
            if first_late and row.late:
                row.report = given
                row.report_usage = usage if row.kind == "trued_up" else None
            return outcome
        row.status, row.kind, row.report, row.report_usage = "settled", "measured", given, usage
        row.input_tokens, row.output_tokens = input_tokens, output_tokens
        row.cost = None if usage is None else credits * NANOS_PER_CREDIT
        self._book_terminal(row, credits, cents, now)
        return "settled"

    def fail(self, org: uuid.UUID, inv: uuid.UUID, credits: int, cents: int, now: datetime) -> str:
        row = self._invocation(org, inv)
        if row.status not in OPEN:
            return self._late(row, credits, cents, None, None, now)  # a late failure reports usage too
        row.status = "failed"
        self._book_terminal(row, credits, cents, now)
        return "failed"

    def _book_terminal(self, row: Invocation, credits: int, cents: int | None, now: datetime) -> None:
        row.charged, row.cents, row.settled_at = credits, cents, now
        if row.execution is not None:  # also after the task closed; it never reopens
            task = self.executions[(row.org, row.execution)]
            task.requests += 1
            task.credits += credits
            task.cents += cents or 0
        period = self.periods[(row.org, row.period)]
        old = period.used
        period.used += credits
        period.cents += cents or 0
        period.held -= row.estimate
        self._crossings(row.org, row.period, old, period.used, now)

    def _crossings(self, org: uuid.UUID, start: date, old: int, new: int, now: datetime) -> None:
        allowance = self.periods[(org, start)].allowance
        if allowance is None:
            return
        for pct in self.orgs[org].thresholds:
            if old * 100 < pct * allowance <= new * 100 and (org, start, pct) not in self.notices:
                self.notices[(org, start, pct)] = Notice(next_attempt_at=now, crossed_at=now)

    def _reached(self, org: uuid.UUID, start: date, now: datetime) -> None:
        allowance, used = self.periods[(org, start)].allowance, self.periods[(org, start)].used
        if allowance is None:
            return
        for pct in self.orgs[org].thresholds:
            if used * 100 >= pct * allowance and (org, start, pct) not in self.notices:
                self.notices[(org, start, pct)] = Notice(next_attempt_at=now, crossed_at=now)

    # ------------------------------------------------------------ tasks

    def open_execution(
        self, org: uuid.UUID, task: str, subject: str | None, replay_key: str | None,
        now: datetime, new_id: uuid.UUID | None,
    ) -> tuple[uuid.UUID, str, bool]:  # fmt: skip
        """``new_id``: the id the database gave a new task (None when it raised)."""
        self._operational(org)
        if task not in self.task_kinds:
            raise Rejected("LL004")
        if replay_key is not None:
            for row in self.executions.values():
                if row.org == org and row.replay_key == replay_key:
                    if (row.task, row.subject) != (task, subject):
                        raise Rejected("LL007")
                    return row.id, row.status, True
        assert new_id is not None, "the database refused an open the model accepts"
        self.executions[(org, new_id)] = Execution(new_id, org, task, subject, replay_key, now)
        return new_id, "running", False

    def close_execution(self, org: uuid.UUID, execution: uuid.UUID, outcome: str, now: datetime) -> bool:
        if outcome not in ("completed", "failed"):
            raise Rejected("LL009")
        row = self.executions.get((org, execution))
        if row is None:
            raise Rejected("LL006")
        if row.status != "running":
            return False
        row.status, row.ended_at = outcome, now
        return True

    # ------------------------------------------------------------ recovery

    def reconcile_org(self, org: uuid.UUID, now: datetime) -> tuple[int, int]:
        """(requests recovered, tasks abandoned)."""
        self._operational(org)
        cutoff = now - RECOVERY_WINDOW
        abandoned = 0
        for task in self.executions.values():
            if task.org == org and task.status == "running" and task.started_at <= cutoff:
                task.status, task.ended_at = "abandoned", now
                abandoned += 1
        stranded = [
            row for row in self.invocations.values()
            if row.org == org and row.status in OPEN and row.created_at <= cutoff
        ]  # fmt: skip
        moved: dict[date, int] = {}
        policy = self.orgs[org].recovery_charge
        for row in stranded:
            charge = row.estimate if policy == "estimate" or (
                policy == "dispatched" and row.status == "dispatched") else 0  # fmt: skip
            row.status, row.kind, row.alerted = "settled", "recovered", True
            row.charged, row.cents, row.settled_at, row.recovered = charge, None, now, charge
            if row.execution is not None:
                task = self.executions[(org, row.execution)]
                task.requests += 1
                task.credits += charge
            period = self.periods[(org, row.period)]
            moved.setdefault(row.period, period.used)
            period.used += charge
            period.held -= row.estimate
        for start, old in moved.items():  # one movement per period, one crossing check
            self._crossings(org, start, old, self.periods[(org, start)].used, now)
        return len(stranded), abandoned

    def run_reconciliation(self, now: datetime) -> None:
        for org in sorted(self.orgs):  # operational ones, in id order
            if self.orgs[org].status == "operational":
                self.reconcile_org(org, now)
        self.rearm_notices(now)
        # every day since the last complete rebuild (at most 35 back) and the reporting days
        today = now.date()
        recent = today - timedelta(days=REPORTING_DAYS - 1)
        first = max(min(recent, self.rebuilt_through or recent), today - timedelta(days=34))
        self.rebuild_daily_usage(first, today)
        self.rebuilt_through = today
        self.passes += 1

    # ------------------------------------------------------------ notices and reporting

    def claim_notices(self, limit: int, now: datetime) -> list[tuple[uuid.UUID, date, int]]:
        due = sorted(
            (n.crossed_at, key) for key, n in self.notices.items()
            if n.status == "owed" and n.next_attempt_at <= now
        )  # fmt: skip
        assert len(due) <= limit, "the simulation claims every due notice at once"
        for _, key in due:
            notice = self.notices[key]
            notice.status, notice.claimed_at = "sending", now
            notice.attempts += 1
        return [key for _, key in due]

    def complete_notice(self, key: tuple[uuid.UUID, date, int]) -> bool:
        notice = self.notices[key]
        if notice.status != "sending":
            return False
        notice.status = "sent"
        return True

    def fail_notice(self, key: tuple[uuid.UUID, date, int], now: datetime) -> bool:
        notice = self.notices[key]
        if notice.status != "sending":
            return False
        backoff = min(NOTICE_BACKOFF_MAX, NOTICE_BACKOFF_BASE * 2 ** (min(notice.attempts, 30) - 1))
        notice.status, notice.claimed_at, notice.next_attempt_at = "owed", None, now + backoff
        return True

    def rearm_notices(self, now: datetime) -> int:
        rearmed = 0
        for notice in self.notices.values():
            if notice.status == "sending" and notice.claimed_at <= now - NOTICE_CLAIM_TIMEOUT:
                notice.status, notice.claimed_at, notice.next_attempt_at = "owed", None, now
                rearmed += 1
        return rearmed

    def rebuild_daily_usage(self, first: date, last: date) -> None:
        self.daily = {k: v for k, v in self.daily.items() if not first <= k[1] <= last}
        for row in self.invocations.values():
            if row.settled_at is None or not first <= row.settled_at.date() <= last:
                continue
            key = (row.org, row.settled_at.date(), row.model)
            n, recovered, credits, cents, tokens_in, tokens_out = self.daily.get(key, (0,) * 6)
            self.daily[key] = (
                n + 1,
                recovered + (row.kind in ("recovered", "trued_up")),
                credits + row.charged,
                cents + (row.cents or 0),
                tokens_in + (row.input_tokens or 0),
                tokens_out + (row.output_tokens or 0),
            )

    def _daily_row(self, key: tuple[uuid.UUID, date, str]) -> tuple[int, ...]:
        """The daily usage row of (organization, day, model) from its terminal requests."""
        rows = [r for r in self.invocations.values()
                if r.settled_at is not None and (r.org, r.settled_at.date(), r.model) == key]  # fmt: skip
        return (
            len(rows),
            sum(r.kind in ("recovered", "trued_up") for r in rows),
            sum(r.charged for r in rows),
            sum(r.cents or 0 for r in rows),
            sum(r.input_tokens or 0 for r in rows),
            sum(r.output_tokens or 0 for r in rows),
        )

    # ------------------------------------------------------------ what the database must show

    def expected_periods(self) -> dict:
        return {k: (p.allowance, p.used, p.held, p.cents) for k, p in self.periods.items()}

    def expected_invocations(self) -> dict:
        return {
            k: (r.status, r.kind, r.charged, r.cents, r.period, r.execution, r.alerted, r.late,
                r.recovered, *r.ids, r.mask)
            for k, r in self.invocations.items()
        }

    def expected_executions(self) -> dict:
        def duration_ms(e: Execution) -> int | None:
            if e.status in ("running", "abandoned"):  # abandoned: ended at detection, no duration
                return None
            return max(0, round((e.ended_at - e.started_at).total_seconds() * 1000))

        return {
            k: (e.status, e.requests, e.credits, e.cents, e.ended_at, duration_ms(e))
            for k, e in self.executions.items()
        }

    def _cost(self, row: Invocation) -> int:
        """A terminal request's cost: its caller's cents x 10^7, or what the book priced."""
        return (row.cents or 0) * 10**7 + (row.cost or 0)

    def expected_costs(self) -> dict:
        """The cost sums: each period's used_cost_nanos and each task's priced_nanos."""
        periods = {k: 0 for k in self.periods}
        tasks = {k: 0 for k in self.executions}
        for r in self.invocations.values():
            if r.status in OPEN:
                continue
            periods[(r.org, r.period)] += self._cost(r)
            if r.execution is not None:
                tasks[(r.org, r.execution)] += r.cost or 0
        return {"periods": {k: (v,) for k, v in periods.items()}, "tasks": {k: (v,) for k, v in tasks.items()},
                "requests": {k: (r.cost,) for k, r in self.invocations.items()}}

    def expected_notices(self) -> dict:
        return {k: (n.status, n.attempts) for k, n in self.notices.items()}
