"""The plan and the model of the concurrent simulation (tests/test_concurrent_simulation.py).

``plan(seed)`` draws one history: a few rounds, each a base clock and, per session, a
short list of operations. ``Model`` rebuilds the books from what committed: it is
fed each round's committed history (the operations in commit order with their
results) and decides nothing the database may decide by ordering. An admission
that committed is a request with its hold; a refusal (LL001) is accepted if the
allowance could have been exhausted at that moment (its upper bound is checked);
the winner of a request is the settlement or failure that answered
``settled``/``failed``, else the pass that could reach it; a task's close that
answered true won over the pass's abandonment. Derived figures (a period's used
and held, a task's totals, sweep_totals, daily usage) are sums over the model's
requests. What the model checks is the right behaviour as docs/contract.md states it
(with the ten concurrency defects 0.3.0 fixed, CHANGELOG "Books airtight under
concurrent actors"): a late failure trues up under
``true_up`` and is recorded under ``audit``; an allowance or threshold change
owes the notices of the levels it puts used at or above; a stale notice worker
cannot end another worker's claim; two passes at once: one runs, one is skipped.

The plan keeps each round decidable from results alone (see ``plan``): a request
is settled by another session only in a later round than its admission, and
dispatched only in its admission's round; policy changes and the ending of
stale notice claims never share a round with a pass; a pass far ahead runs in a
round without admissions or notice work. So the pass recovers exactly the
requests open before its round, old enough for its clock, that no live call of
the round settled or failed first, and it re-arms only claims of earlier rounds.
Two upserts of one organization in a round apply in commit order.

Budgets: operator sessions set, change and remove budgets (own and
``'*'``, organization day/week, project/api_key/end_user day/week/month) while
admissions name scope ids from a small pool. Which budgets applied to a request
is read from its committed ``budget_mask`` (an admission reads the budgets in
its own snapshot, which may precede a set_budget that commits before it: the
contract is "wholly with or wholly without"), and the model checks that the
mask and the decision fit one budget state in force during the admission's
round up to its commit: every counter the request was admitted under had room,
and a refusal's named budget had none while every budget before it had. A
counter's figures are exact in commit order (its row lock orders every mover);
a pass of the round may have recovered its eligible requests before or after, so
decisions are checked against the bounds of both. Counters are sums over the
model's requests and must equal llm.budget_counters at every round end.

Retention: each history runs under a budget_retention from one hour (the
shortest the settings allow, well under the 24 h recovery window) to the default,
with estimate-0 requests, passes ahead of and behind the requests, and admissions
dated up to 72 h before their round's clock (in rounds without a pass, so no pass
can reach them in their round), into windows retention may have purged. The
horizons are read from the books after each round and checked: only raised, only
by a pass, never past the pass's clock less budget_retention nor past the day of a
request open throughout the round. A counter the books lost is taken as purged only
where retention could have deleted it (a window ended on or before the horizon,
nothing held, no open request admitted under it); a purged window's counter never
comes back, no admission creates a counter of a window the horizon had passed at
its round's start, and an LL012 refusal must name a window the horizon passed. A
late true-up into a purged window moves no counter and owes no notice: nothing can
be admitted there again.
"""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any

from model import NoticeDelivery

RECOVERY_WINDOW = timedelta(hours=24)
NOTICE_CLAIM_TIMEOUT = timedelta(minutes=15)
NOTICE_BACKOFF_BASE = timedelta(minutes=1)
NOTICE_BACKOFF_MAX = timedelta(hours=6)
OPEN = ("reserved", "dispatched")

START = datetime(2026, 1, 30, 20, 0, tzinfo=UTC)  # two days before a month boundary
ORG_A = "00000000-0000-4000-8000-00000000a001"  # a small allowance, over 4 stripes
ORG_B = "00000000-0000-4000-8000-00000000b002"  # a larger one, over 2 stripes
SETUP = {  # allowance, thresholds, stripes
    ORG_A: (100, (50, 80, 100), 4),
    ORG_B: (300, (80, 100), 2),
}
ALLOWANCES = {ORG_A: (40, 60, 100, 150), ORG_B: (150, 300, 500)}
THRESHOLDS = {
    ORG_A: ((50, 80, 100), (80, 100), (30, 50, 80, 100), (100,)),
    ORG_B: ((80, 100), (50, 100)),
}
MODELS = ("m-1", "m-2")
# Budgets: the scope ids admissions name, and what set_budget sets
SCOPE_IDS = {"project": ("p-1", "p-2"), "api_key": ("k-1", "k-2"),
             "end_user": ("u-1", "u-2", "u-3")}  # fmt: skip
SCOPES = ("organization", "project", "api_key", "end_user")  # in the order a refusal names them
WINDOWS = ("day", "week", "month")
BUDGET_LIMITS = (15, 30, 50, 80, None)  # None removes the budget
BUDGET_THRESHOLDS = ((80, 100), (50, 100), (100,))
CLOCK_STEPS = (  # between rounds; 25 h and 3 days let the recovery window pass
    timedelta(minutes=5), timedelta(minutes=20), timedelta(hours=2),
    timedelta(hours=13), timedelta(hours=25), timedelta(days=3),
)  # fmt: skip
WEIGHTS = {  # per slot of a session: operator-leaning (False) and consumer-leaning (True) sessions
    False: {
        "admit": 10,
        "settle": 15,
        "close": 3,
        "upsert": 15,
        "policy": 10,
        "stripes": 12,
        "claim": 35,
        "budget": 25,
    },
    True: {
        "admit": 45,
        "settle": 36,
        "close": 4,
        "upsert": 4,
        "policy": 2,
        "stripes": 3,
        "claim": 6,
        "budget": 3,
    },
}
TASK_KIND = "sim.task"
# Retention: a history's budget_retention, from the shortest the settings allow
# to beyond the history; admissions in a round without a pass may be dated this many hours
# before the round's clock, into windows retention may have purged.
RETENTIONS = {"1 hour": timedelta(hours=1), "6 hours": timedelta(hours=6), "1 day": timedelta(days=1),
              "2 days": timedelta(days=2), "400 days": timedelta(days=400)}  # fmt: skip
BACK_HOURS = (1, 3, 8, 20, 30, 50, 72)


def retention_of(seed: int) -> str:
    """The budget_retention of history ``seed`` (a key of RETENTIONS)."""
    return random.Random(seed ^ 0x2E7E).choice(sorted(RETENTIONS))


def period_of(at: datetime) -> date:
    """The UTC calendar month containing ``at`` (its first day)."""
    return date(at.year, at.month, 1)


def window_start(window: str, at: datetime) -> date:
    """The first day of the UTC calendar window (day, week from Monday, month) containing ``at``."""
    day = at.astimezone(UTC).date()
    if window == "day":
        return day
    if window == "week":
        return day - timedelta(days=day.weekday())
    return day.replace(day=1)


def window_end(window: str, start: date) -> date:
    """The day after the last day of the window starting at ``start`` (llm._window_end)."""
    if window == "day":
        return start + timedelta(days=1)
    if window == "week":
        return start + timedelta(days=7)
    return (start.replace(day=28) + timedelta(days=4)).replace(day=1)


def slot(scope: str, window: str) -> int:
    """The budget_mask bit of a scope and window (3 * scope + window)."""
    return 3 * SCOPES.index(scope) + WINDOWS.index(window)


def request_scopes_sql(conn: Any) -> str:
    """A query of every request's organization, id, scope ids (project, api_key,
    end_user) and budget_mask (0 when none), kept on the request (0.4.0 on) or beside it
    in llm.invocation_scopes (before)."""
    return ("SELECT i.organization_id, i.id, coalesce(i.project, s.project), coalesce(i.api_key, s.api_key),"
            " coalesce(i.end_user, s.end_user), coalesce(i.budget_mask, s.budget_mask, 0)"
            " FROM llm.invocations AS i LEFT JOIN llm.invocation_scopes AS s"
            " ON s.organization_id = i.organization_id AND s.invocation_id = i.id"
            " AND i.budget_mask IS NULL")  # fmt: skip


def iso(at: datetime) -> str:
    return at.isoformat()


def when(text: str) -> datetime:
    return datetime.fromisoformat(text)


# ---------------------------------------------------------------- the plan


def plan(seed: int, sessions: int = 4, rounds: int = 5) -> list[dict[str, Any]]:
    """One history's rounds (5: enough for a claim to go stale, be re-armed by a pass,
    claimed again and then ended by its stale worker): ``{"clock", "pass", "far", "sessions": [[op, ...], ...]}``.

        An op is a dict ``{"op": name, ...arguments}``; ``claim`` and ``end_stale`` are
        notice work whose calls the worker decides at run time from what it claimed
        (with a random generator seeded from the plan, so a run is reproducible).
        Sessions 0 and 1 lean to consumer work, 2 and 3 to operator work; every
        session may do either, on its app or its operator connection."""
    rng = random.Random(seed)
    clock = START
    admitted: list[tuple[str, str, int]] = []  # (org, request id, round)
    tasks: list[tuple[str, str, int]] = []  # (org, replay key, round)
    out = []
    for r in range(rounds):
        if r:
            clock += rng.choice(CLOCK_STEPS)
        has_pass = rng.random() < 0.5
        far = has_pass and rng.random() < 0.2
        passers = (
            set(rng.sample(range(sessions), 2 if rng.random() < 0.25 else 1)) if has_pass else set()
        )
        round_ops: list[list[dict[str, Any]]] = []
        for s in range(sessions):
            ops: list[dict[str, Any]] = []
            mine: list[tuple[str, str, int]] = []  # admitted by this session this round
            if r == 0 and s >= 2:  # budgets from the start: the operator sessions set one each
                ops.extend(_draw(rng, "budget", r, [], mine, tasks))
            for _ in range(rng.randint(1, 3)):
                targets = [a for a in admitted if a[2] < r] + mine
                weights = dict(WEIGHTS[s < 2])
                # a round far ahead: no admissions and no notice work (decidable, see above)
                if far:
                    weights.pop("admit"), weights.pop("claim")
                if has_pass:  # policy changes never share a round with a pass
                    weights.pop("policy")
                if not targets:
                    weights.pop("settle")
                kind = rng.choices(list(weights), list(weights.values()))[0]
                ops.extend(_draw(rng, kind, r, targets, mine, tasks))
            if not has_pass:  # dated back: no pass of the round can reach them (decidable)
                for op in ops:
                    if op["op"] == "admit" and not op["task"] and rng.random() < 0.3:
                        op["back_hours"] = rng.choice(BACK_HOURS)
            if not has_pass and rng.random() < 0.7:
                ops.append({"op": "end_stale", "seed": rng.getrandbits(32)})
            if s in passers:
                ops.insert(rng.randint(0, len(ops)), {"op": "pass"})
            round_ops.append(ops)
            admitted.extend(mine)
        # a pass far ahead of the requests, or behind them (a lagging scheduler's clock:
        # up to two days before the round's, which may precede the round's admissions)
        behind = has_pass and not far and rng.random() < 0.25
        if far:
            pass_clock = clock + timedelta(days=rng.randint(20, 40))
        elif behind:
            pass_clock = clock - timedelta(hours=rng.randint(1, 48))
        else:
            pass_clock = clock
        out.append({"clock": iso(clock), "pass_clock": iso(pass_clock), "pass": has_pass, "far": far,
                    "sessions": round_ops})  # fmt: skip
    return out


def _draw(
    rng: random.Random, kind: str, r: int, targets: list, mine: list, tasks: list
) -> list[dict]:
    """The calls of one slot of a session's round (an admission may open a task first,
    and close it after: admissions only go into a task of their own round, so no pass
    can abandon it under them)."""
    org = ORG_A if rng.random() < 0.7 else ORG_B
    if kind == "admit":
        inv = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        ops: list[dict[str, Any]] = []
        task = None
        if rng.random() < 0.3:
            task = f"t-{rng.getrandbits(48):x}"
            ops.append({"op": "open", "org": org, "task": task})
            tasks.append((org, task, r))
        ops.append({"op": "admit", "org": org, "inv": inv, "estimate": rng.choice((0, 5, 10, 20, 30, 40)),
                    "model": rng.choice(MODELS), "task": task}
                   | {scope: rng.choice(ids) if rng.random() < 0.6 else None
                      for scope, ids in SCOPE_IDS.items()})  # fmt: skip
        mine.append((org, inv, r))
        if rng.random() < 0.6:
            ops.append({"op": "dispatch", "org": org, "inv": inv})
        if task and rng.random() < 0.3:
            ops.append({"op": "close", "org": org, "task": task, "outcome": "completed"})
        return ops
    if kind == "settle":
        org, inv, _ = rng.choice(targets)
        credits = rng.choice((0, 5, 10, 20, 30, 45, 60))
        if rng.random() < 0.7:
            return [{"op": "settle", "org": org, "inv": inv, "credits": credits, "cents": rng.randint(0, 9),
                     "tokens": rng.choice((None, 100, 250))}]  # fmt: skip
        return [{"op": "fail", "org": org, "inv": inv, "credits": rng.choice((0, 0, credits)),
                 "cents": rng.randint(0, 3)}]  # fmt: skip
    if kind == "close":
        old = [t for t in tasks if t[2] < r]
        if not old:
            return []
        org, task, _ = rng.choice(old)
        return [
            {
                "op": "close",
                "org": org,
                "task": task,
                "outcome": rng.choice(("completed", "failed")),
            }
        ]
    if kind == "upsert":
        return [{"op": "upsert", "org": org, "allowance": rng.choice(ALLOWANCES[org]),
                 "thresholds": list(rng.choice(THRESHOLDS[org]))}]  # fmt: skip
    if kind == "policy":
        return [{"op": "policy", "org": org, "charge": rng.choice(("estimate", "dispatched", "none")),
                 "late": rng.choice(("audit", "true_up", "true_up"))}]  # fmt: skip
    if kind == "stripes":
        return [{"op": "stripes", "org": org, "stripes": rng.choice((1, 2, 3, 4, 8, 0))}]
    if kind == "budget":
        scope = rng.choice(SCOPES)
        scope_id = (
            None
            if scope == "organization"
            else "*"
            if rng.random() < 0.5
            else rng.choice(SCOPE_IDS[scope])
        )
        return [{"op": "budget", "org": org, "scope": scope, "scope_id": scope_id,
                 "window": rng.choice(WINDOWS[:2] if scope == "organization" else WINDOWS),
                 "limit": rng.choice(BUDGET_LIMITS), "thresholds": list(rng.choice(BUDGET_THRESHOLDS))}]  # fmt: skip
    return [{"op": "claim", "limit": rng.randint(1, 3), "seed": rng.getrandbits(32)}]


# ---------------------------------------------------------------- the model


class Mismatch(AssertionError):
    """The committed history or the books disagree with the model."""


@dataclass
class Request:
    org: str
    period: date
    model: str
    estimate: int
    created_at: datetime
    status: str = "reserved"
    kind: str | None = None  # measured | recovered | trued_up
    charged: int | None = None
    cents: int | None = None
    tokens: int | None = None
    settled_at: datetime | None = None
    alerted: bool = False
    late: bool = False
    report: tuple | None = None  # its stored measured settlement's figures (LL007 on others)
    recovered: int | None = None
    task: str | None = None  # the replay key of its task
    ids: dict[str, str | None] = field(default_factory=dict)  # project, api_key, end_user
    mask: int = 0  # the budget counters it moves (its committed budget_mask)


@dataclass
class Task:
    org: str
    started_at: datetime
    status: str = "running"


@dataclass
class Org:
    allowance: int
    thresholds: tuple[int, ...]
    charge: str = "estimate"
    late: str = "audit"
    changed_month: date | None = None  # the month of the last upsert's clock
    lists: set[tuple[int, ...]] = field(default_factory=set)  # every threshold list it had


@dataclass
class Notice(NoticeDelivery):
    claim: tuple[int, str] | None = None  # the live claim: (worker, the worker's name for it)


ALLOWANCE = ("organization", None, "month")  # a notice key's scope, id and window for the allowance
Budgets = dict[tuple[str, str, str | None, str], tuple[int, tuple[int, ...]]]


class Model:
    """The books as the committed history says they must be."""

    def __init__(self) -> None:
        self.orgs: dict[str, Org] = {}
        self.allowances: dict[tuple[str, date], int] = {}  # per period
        self.requests: dict[str, Request] = {}
        self.tasks: dict[str, Task] = {}  # by replay key
        # by (org, window start, threshold, scope, scope id, window)
        self.notices: dict[tuple, Notice] = {}
        # (org, scope, scope id or '*' or None, window) -> (limit, thresholds), and how
        # often each was set or removed (a budget set once and never replaced owes exactly)
        self.budgets: Budgets = {}
        self.budget_sets: dict[tuple[str, str, str | None, str], int] = {}
        self.states: list[Budgets] = []  # the budgets in force after each change of the round
        self.eligible: dict[str, datetime] = {}  # the requests the round's pass may recover
        # Retention: the organizations' horizons at the round's start and, read
        # from the books before the round is applied (observe), at its end; the counters
        # retention deleted (their windows are never admitted again)
        self.retention = RETENTIONS["400 days"]
        self.horizons: dict[str, date] = {}
        self.horizons_end: dict[str, date] = {}
        self.purged: set[tuple] = set()
        self.round_passes: list[datetime] = []
        self.open_at_start: set[str] = set()
        self.counters_at_start: set[tuple] = set()
        self.horizons_at_start: dict[str, date] = {}

    # ------------------------------------------------------------ setup and rounds

    def setup(
        self, org: str, allowance: int, thresholds: tuple[int, ...], charge: str, late: str
    ) -> None:
        self.orgs[org] = Org(allowance, tuple(thresholds), charge, late, None, {tuple(thresholds)})

    def round(self, info: dict[str, Any], history: list[dict[str, Any]]) -> None:
        """Apply one round's committed history (commit order); raise Mismatch where a
        result is not one the right behaviour allows."""
        passes = [when(e["args"]["now"]) for e in history if e["op"] == "pass"]
        self.round_passes = passes
        self.open_at_start = {k for k, r in self.requests.items() if r.status in OPEN}
        self.counters_at_start = set(self.counters())
        self.horizons_at_start = dict(self.horizons)
        eligible: dict[str, datetime] = {}  # requests the pass recovers unless a live call won
        stale: set[str] = set()  # tasks the pass abandons unless a close came first
        if passes:  # the plan keeps everything a pass decides to what was there before the round
            at = max(passes)
            self._rearm(at)  # only earlier rounds' claims are old enough
            cutoff = at - RECOVERY_WINDOW
            eligible = {
                k: at
                for k, r in self.requests.items()
                if r.status in OPEN and r.created_at <= cutoff
            }
            stale = {
                k for k, t in self.tasks.items() if t.status == "running" and t.started_at <= cutoff
            }
        policies = {org: {(o.charge, o.late)} for org, o in self.orgs.items()}
        for e in history:
            if e["op"] == "policy" and "ok" in e:
                policies[e["args"]["org"]].add((e["args"]["charge"], e["args"]["late"]))
        upserts: dict[str, list[dict[str, Any]]] = {}
        load = self._loads()
        # the budgets in force after each of the round's changes, all of them: a change
        # recorded after an admission may have committed before its snapshot
        self.states = [dict(self.budgets)]
        for e in history:
            if e["op"] == "budget" and "ok" in e:
                a = e["args"]
                state = dict(self.states[-1])
                budget = (a["org"], a["scope"], a["scope_id"], a["window"])
                if a["limit"] is None:
                    state.pop(budget, None)
                else:
                    state[budget] = (a["limit"], tuple(sorted(set(a["thresholds"]))))
                self.states.append(state)
        self.eligible = eligible
        # History is the order the sessions recorded their commits, not the order their
        # decisions saw each other: a budget decision is checked once the round is known,
        # against every load its counters could have had (_counter_bounds).
        self.start_loads = {inv: (r.estimate if r.status in OPEN else r.charged)
                            for inv, r in self.requests.items()}  # fmt: skip
        self.admitted_in_round: dict[str, tuple[int, int]] = {}  # request -> (session, index)
        self.budget_checks: list[tuple[int, dict[str, Any], Request | None]] = []
        for index, e in enumerate(history):
            self.index = index
            self._apply(e, eligible, stale, policies, upserts, load)
        for index, e, request in self.budget_checks:
            if request is None:
                self._budget_refused(e, index)
            else:
                self._budget_admitted(e, request, index)
        for key in stale:
            if self.tasks[key].status == "running":
                self.tasks[key].status = "abandoned"
        for inv, at in eligible.items():  # the pass reached every one no live call took first
            if self.requests[inv].status in OPEN:
                self._recover(inv, at)
        for org, changes in upserts.items():  # after the round's periods exist (same month)
            for args in changes:
                self._upsert(org, args["allowance"], tuple(args["thresholds"]), when(args["now"]))
        self._check_horizons()

    def _loads(self) -> dict[tuple[str, date], int]:
        load: dict[tuple[str, date], int] = {}
        for r in self.requests.values():
            key = (r.org, r.period)
            load[key] = load.get(key, 0) + (r.estimate if r.status in OPEN else r.charged)
        return load

    def _apply(self, e, eligible, stale, policies, upserts, load) -> None:  # noqa: C901 - one branch per op
        op, a = e["op"], e["args"]
        code = e.get("err")
        if op == "admit" and a.get("task") and code in ("LL006", "LL009"):
            task = self.tasks.get(a["task"])
            return self._expect(
                e, "LL006" if task is None else None if task.status == "running" else "LL009"
            )
        if op == "admit" and code == "LL012":
            return self._horizon_refused(e)
        if op == "admit":
            key = (a["org"], period_of(when(a["now"])))
            if code == "LL001" and (e.get("budget") or ["periods"])[0] == "budgets":
                return self.budget_checks.append((self.index, e, None))
            if code == "LL001":
                # the smallest allowance in force at any moment of the round
                allowance = min([self.allowances.get(key, self.orgs[a["org"]].allowance)]
                                + [u["allowance"] for u in upserts.get(a["org"], [])])  # fmt: skip
                if load.get(key, 0) + a["estimate"] <= allowance:
                    raise Mismatch(f"LL001 refused {a} while the period's used + held could be at most "
                                   f"{load.get(key, 0)} of {allowance}")  # fmt: skip
                return
            self._expect(e, None)
            task = self.tasks.get(a.get("task") or "")
            if a.get("task") and (task is None or task.status != "running"):
                raise Mismatch(f"admitted {a} into a task that is {task and task.status}")
            self.allowances.setdefault(key, self.orgs[a["org"]].allowance)
            request = Request(a["org"], key[1], a["model"], a["estimate"], when(a["now"]), task=a.get("task"),
                              ids={s: a.get(s) for s in SCOPE_IDS}, mask=e.get("mask") or 0)  # fmt: skip
            self.budget_checks.append((self.index, e, request))
            self.admitted_in_round[a["inv"]] = (e["session"], self.index)
            self.requests[a["inv"]] = request
            load[key] = load.get(key, 0) + a["estimate"]
        elif op == "dispatch":
            row = self.requests.get(a["inv"])
            self._expect(e, "LL005" if row is None else None if row.status in OPEN else "LL009")
            if row is not None and row.status == "reserved":
                row.status = "dispatched"
        elif op in ("settle", "fail"):
            self._settle_or_fail(e, eligible, policies, load)
        elif op == "open":
            self._expect(e, None)
            if e["ok"] is not False:  # replayed: a key is opened once
                raise Mismatch(f"open_execution {a} answered replayed = {e['ok']}")
            self.tasks[a["task"]] = Task(a["org"], when(a["now"]))
        elif op == "close":
            self._close(e, stale)
        elif op == "upsert":
            self._expect(e, None)
            upserts.setdefault(a["org"], []).append(a)  # commit order: the last one stays
        elif op == "budget":
            self._expect(e, None)
            budget = (a["org"], a["scope"], a["scope_id"], a["window"])
            self.budget_sets[budget] = self.budget_sets.get(budget, 0) + 1
            if a["limit"] is None:
                self.budgets.pop(budget, None)
            else:
                self.budgets[budget] = (a["limit"], tuple(sorted(set(a["thresholds"]))))
        elif op == "policy":
            self._expect(e, None)
            self.orgs[a["org"]].charge, self.orgs[a["org"]].late = a["charge"], a["late"]
        elif op == "stripes":
            self._expect(e, None if 1 <= a["stripes"] <= 64 else "22023")
            if code is None and e["ok"] != a["stripes"]:
                raise Mismatch(f"set_period_stripes returned {e['ok']} for {a}")
        elif op == "pass":
            self._expect(e, None)
        elif op == "claim":
            self._expect(e, None)
            for org, period, pct, claim, *budget in e["ok"]:
                key = (org, date.fromisoformat(period), pct, *(budget or ALLOWANCE))
                self._claim(key, e["session"], claim, when(a["now"]))
        elif op in ("complete", "fail_notice", "release"):
            self._expect(e, None)
            self._end_claim(e, when(a["now"]))
        else:
            raise Mismatch(f"unknown op {op}")

    def _close(self, e: dict[str, Any], stale: set[str]) -> None:
        """close_execution answers true iff the task was running; a pass of the round
        may have abandoned it first (STATE-PFM-LLM-002: close and abandonment race, one wins)."""
        a = e["args"]
        task = self.tasks.get(a["task"])
        self._expect(e, "LL006" if task is None else None)
        if task is None:
            return
        if e["ok"] is False and task.status == "running" and a["task"] in stale:
            task.status = "abandoned"
        if e["ok"] != (task.status == "running"):
            raise Mismatch(f"close_execution {a} answered {e['ok']}, the task was {task.status}")
        if e["ok"]:
            task.status = a["outcome"]

    @staticmethod
    def _expect(e: dict[str, Any], code: str | None) -> None:
        if e.get("err") != code:
            raise Mismatch(f"{e['op']} {e['args']} gave {e.get('err') or e.get('ok')!r}, the model expected "
                           f"{code or 'success'}")  # fmt: skip

    # ------------------------------------------------------------ requests

    def _settle_or_fail(self, e, eligible, policies, load) -> None:
        a, answer = e["args"], e.get("ok")
        row = self.requests.get(a["inv"])
        if row is None:
            return self._expect(e, "LL005")
        given = (a["credits"], a["cents"], a.get("tokens"))
        if e["op"] == "settle" and e.get("err") == "LL007":  # a repeat with other figures
            if row.status in OPEN or row.report is None or row.report == given:
                raise Mismatch(f"settle {a} gave LL007, but {row.status} stored {row.report}")
            return None
        self._expect(e, None)
        now = when(a["now"])
        fresh = "settled" if e["op"] == "settle" else "failed"
        if answer == fresh:
            if row.status not in OPEN:
                raise Mismatch(
                    f"{e['op']} of {a['inv']} answered {answer}, but it was {row.status}/{row.kind}"
                )
            row.status = "settled" if fresh == "settled" else "failed"
            row.kind = "measured" if fresh == "settled" else None
            row.tokens = a.get("tokens")
            row.report = given if fresh == "settled" else None
            self._book(row, a["credits"], a["cents"], now, load)
            return None
        if row.status in OPEN and a["inv"] in eligible:  # the pass took it first
            self._recover(a["inv"], eligible[a["inv"]])
        expected = self._already(row)
        if expected == "already_recovered" and not row.late:  # the first late settlement or failure
            row.late = True
            allowed = {late for _, late in policies[row.org]}
            if answer == "trued_up" and "true_up" in allowed:
                load[(row.org, row.period)] = load.get((row.org, row.period), 0) + max(
                    0, a["credits"] - row.charged
                )
                self._true_up(row, a["credits"], a["cents"], a.get("tokens"))
                row.report = given if e["op"] == "settle" else None
                return None
            if answer == "already_recovered" and "audit" in allowed:
                row.report = given if e["op"] == "settle" else None
                return None
            raise Mismatch(f"late {e['op']} of {a['inv']} (recovered at {row.recovered}) answered {answer!r}; "
                           f"late_settlement was {sorted(allowed)} (for a failure)")  # fmt: skip
        if e["op"] == "settle" and row.report is not None and row.report != given:
            raise Mismatch(f"settle {a} answered {answer!r} in silence; its stored figures {row.report} differ")
        if answer != expected:
            # on 0.2.0 a late failure only reads, so it can answer from before a true-up
            hint = (
                " (a late failure records nothing)" if e["op"] == "fail" else ""
            )
            raise Mismatch(
                f"{e['op']} of {a['inv']} answered {answer!r}, the model expected {expected!r}{hint}"
            )
        return None

    @staticmethod
    def _already(row: Request) -> str:
        if row.status in OPEN:
            return "open"
        if row.status == "failed":
            return "already_failed"
        return "already_recovered" if row.kind == "recovered" else "already_settled"

    def _book(
        self, row: Request, credits: int, cents: int | None, now: datetime, load=None
    ) -> None:
        row.charged, row.cents, row.settled_at = credits, cents, now
        if load is not None:
            load[(row.org, row.period)] = load.get((row.org, row.period), 0) + max(
                0, credits - row.estimate
            )

    def _recovery_charge(self, row: Request) -> int:
        org = self.orgs[row.org]
        if org.charge == "estimate" or (org.charge == "dispatched" and row.status == "dispatched"):
            return row.estimate
        return 0

    def _recover(self, inv: str, at: datetime) -> None:
        row = self.requests[inv]
        charge = self._recovery_charge(row)
        row.status, row.kind, row.alerted, row.recovered = "settled", "recovered", True, charge
        self._book(row, charge, None, at)

    def _true_up(self, row: Request, credits: int, cents: int, tokens: int | None) -> None:
        row.kind, row.charged, row.cents, row.tokens = "trued_up", credits, cents, tokens

    # ------------------------------------------------------------ budgets

    @staticmethod
    def applying(state: Budgets, org: str, ids: dict[str, str | None]) -> dict[int, tuple]:
        """The budgets that apply to a request naming ``ids`` under ``state``: bit ->
        (limit, counter key without its window start), in bit order."""
        out = {}
        for scope in SCOPES:
            sid = None if scope == "organization" else ids.get(scope)
            if scope != "organization" and sid is None:
                continue
            for window in WINDOWS:
                budget = state.get((org, scope, sid, window)) or state.get(
                    (org, scope, "*", window)
                )
                if budget:
                    out[slot(scope, window)] = (budget[0], (org, scope, sid, window))
        return out

    def _counter_keys(self, r: Request) -> list[tuple]:
        """The counters request ``r`` moves: (org, scope, id, window, window start) per bit."""
        keys = []
        for scope in SCOPES:
            for window in WINDOWS:
                if r.mask & (1 << slot(scope, window)):
                    sid = None if scope == "organization" else r.ids.get(scope)
                    keys.append((r.org, scope, sid, window, window_start(window, r.created_at)))
        return keys

    def _counter_bounds(
        self, key: tuple, session: int, index: int, own: str | None = None
    ) -> tuple[int, int]:
        """The lowest and highest used + held counter ``key`` could have had when the call
        at ``index`` of the round by ``session`` decided: each request's load anywhere
        between its load at the round's start (its estimate when admitted in the round) and
        now, less what the round's pass may have recovered already; a request another
        session admitted in the round perhaps not yet, and one this session admitted later
        (or ``own``, the request being decided) not at all."""
        high = low = 0
        for inv, r in self.requests.items():
            if inv == own or key not in self._counter_keys(r):
                continue
            now = r.estimate if r.status in OPEN else r.charged
            admitted = self.admitted_in_round.get(inv)
            if admitted and admitted[0] == session and admitted[1] > index:
                continue
            before = r.estimate if admitted else self.start_loads[inv]
            high += max(before, now)
            if admitted and admitted[0] != session:
                continue
            low += min(before, now) - (r.estimate - self._recovery_charge(r)
                                       if r.status in OPEN and inv in self.eligible else 0)  # fmt: skip
        return low, high

    def _budget_admitted(self, e: dict[str, Any], r: Request, index: int) -> None:
        """An admitted request's mask and holds fit one budget state in force during its
        round up to its commit (wholly with or wholly without a concurrent set_budget)."""
        at = r.created_at
        for state in self.states:
            applying = self.applying(state, r.org, r.ids)
            if sum(1 << b for b in applying) != r.mask:
                continue
            if all(self._counter_bounds((*k, window_start(k[3], at)), e["session"], index, e["args"]["inv"])[0]
                   + r.estimate <= limit
                   for limit, k in applying.values()):  # fmt: skip
                return
        raise Mismatch(f"admitted {e['args']} with budget_mask {r.mask}, which no budget state of the round "
                       f"admits: {[self.applying(st, r.org, r.ids) for st in self.states]}")  # fmt: skip

    def _budget_refused(self, e: dict[str, Any], index: int) -> None:
        """A refusal naming a budget (TABLE budgets, CONSTRAINT scope, COLUMN window, the
        DETAIL's first line the real id): in one state of the round that budget applied and
        had no room, and every budget before it in bit order had."""
        a = e["args"]
        _, scope, window, first = e["budget"]
        named = slot(scope, window)
        ids = {s: a.get(s) for s in SCOPE_IDS}
        if first != (a["org"] if scope == "organization" else ids[scope]):
            raise Mismatch(
                f"refusal of {a} names id {first!r}, not the request's {scope}"
            )
        at = when(a["now"])
        for state in self.states:
            applying = self.applying(state, a["org"], ids)
            if named not in applying:
                continue
            bounds = {b: self._counter_bounds((*k, window_start(k[3], at)), e["session"], index)
                      for b, (_, k) in applying.items()}  # fmt: skip
            if bounds[named][1] + a["estimate"] > applying[named][0] and all(
                bounds[b][0] + a["estimate"] <= applying[b][0] for b in applying if b < named
            ):
                return
        raise Mismatch(f"refused {a} naming the {scope} {window} budget, which no budget state of the round "
                       f"refuses first: {[self.applying(st, a['org'], ids) for st in self.states]}")  # fmt: skip

    # ------------------------------------------------------------ organizations

    # ------------------------------------------------------------ retention

    def observe(self, horizons: dict[str, date]) -> None:
        """The horizons the books hold after the round about to be applied."""
        self.horizons_end = dict(horizons)

    def _horizon_refused(self, e: dict[str, Any]) -> None:
        """LL012: in one budget state of the round the request applied to a counter of a
        window that ended on or before its organization's horizon (by the round's end at
        the latest: it is only raised). That the counter did not exist is checked by
        retain: a counter such a window gains after the horizon passed it is a Mismatch."""
        a = e["args"]
        horizon, at = self.horizons_end.get(a["org"]), when(a["now"])
        ids = {s: a.get(s) for s in SCOPE_IDS}
        for state in self.states:
            for _, k in self.applying(state, a["org"], ids).values():
                if horizon is not None and window_end(k[3], window_start(k[3], at)) <= horizon:
                    return
        raise Mismatch(f"LL012 refused {a}, but none of its windows ended on or before the horizon "
                       f"{horizon}")  # fmt: skip

    def _check_horizons(self) -> None:
        """A horizon is only raised, only by a pass, never past the day of the pass's clock
        less budget_retention (the sim's clocks are behind the server's: LEAST(p_now, now())
        is p_now) nor past the day of a request open throughout the round."""
        for org in self.orgs:
            old, new = self.horizons.get(org), self.horizons_end.get(org)
            if old is not None and (new is None or new < old):
                raise Mismatch(f"{org}'s horizon went from {old} to {new}: it is only raised")
            if new == old:
                continue
            if not self.round_passes:
                raise Mismatch(f"{org}'s horizon moved to {new} in a round without a pass")
            bound = (max(self.round_passes) - self.retention).astimezone(UTC).date()
            if new > bound:
                raise Mismatch(
                    f"{org}'s horizon {new} is past the pass's clock less budget_retention {bound}"
                )
            for inv in self.open_at_start:
                r = self.requests[inv]
                if r.org == org and r.status in OPEN and new > r.created_at.astimezone(UTC).date():
                    raise Mismatch(f"{org}'s horizon {new} passed request {inv}, open since {r.created_at} "
                                   "")  # fmt: skip
        self.horizons = dict(self.horizons_end)

    def retain(self, db: dict[tuple, tuple[int, int, int]]) -> None:
        """Take the counters retention deleted in the round into ``purged``, where it may
        have: a round with a pass, a window ended on or before the horizon, nothing held
        and no open request admitted under it. A purged window's counter never
        comes back, and no admission creates a counter of a window the horizon
        had passed at the round's start (LL012)."""
        expected = self.counters()
        for key in expected.keys() - db.keys():
            horizon = self.horizons_end.get(key[0])
            if (
                not self.round_passes
                or horizon is None
                or window_end(key[3], key[4]) > horizon
                or expected[key][1] != 0
                or any(
                    r.status in OPEN and key in self._counter_keys(r)
                    for r in self.requests.values()
                )
            ):
                continue  # not retention's: the comparison of the counters reports it
            self.purged.add(key)
        back = sorted(self.purged & db.keys())
        if back:
            raise Mismatch(f"counters of purged windows are back: {back}")
        for key in db.keys() - self.counters_at_start:
            start = self.horizons_at_start.get(key[0])
            if start is not None and window_end(key[3], key[4]) <= start:
                raise Mismatch(
                    f"counter {key} was created past the horizon {start} (LL012)"
                )

    def _upsert(self, org: str, allowance: int, thresholds: tuple[int, ...], now: datetime) -> None:
        o = self.orgs[org]
        # a changed allowance applies to the period containing now and later ones (invariant 9)
        if allowance != o.allowance:
            for key in self.allowances:
                if key[0] == org and key[1] >= period_of(now):
                    self.allowances[key] = allowance
        o.allowance, o.thresholds, o.changed_month = (
            allowance,
            tuple(sorted(set(thresholds))),
            period_of(now),
        )
        o.lists.add(o.thresholds)

    # ------------------------------------------------------------ notices

    def _rearm(self, now: datetime) -> None:
        for n in self.notices.values():
            if n.status == "sending" and n.claimed_at <= now - NOTICE_CLAIM_TIMEOUT:
                n.status, n.claimed_at, n.claim, n.next_attempt_at = "owed", None, None, now

    def _claim(self, key: tuple[str, date, int], worker: int, claim: str, now: datetime) -> None:
        n = self.notices.setdefault(key, Notice(next_attempt_at=now))  # created in this round
        if n.status != "owed" or n.next_attempt_at > now:
            raise Mismatch(f"claim_notices by worker {worker} took {key}, which was {n.status} "
                           f"(due {n.next_attempt_at})")  # fmt: skip
        n.status, n.attempts, n.claimed_at, n.claim = (
            "sending",
            n.attempts + 1,
            now,
            (worker, claim),
        )

    def _end_claim(self, e: dict[str, Any], now: datetime) -> None:
        a = e["args"]
        key = (a["org"], date.fromisoformat(a["period"]), a["pct"],
               *(a.get("budget") or ALLOWANCE))  # fmt: skip
        n = self.notices[key]
        live = n.status == "sending" and n.claim == (e["session"], a["claim"])
        if e["ok"] != live:
            raise Mismatch(f"{e['op']} of {key} by worker {e['session']} (claim {a['claim']}) answered {e['ok']}; "
                           f"the claim is {'live' if live else 'not its own any more'} "
                           "(when a stale worker ends another's claim)")  # fmt: skip
        if not live:
            return
        if e["op"] == "complete":
            n.status, n.claim = "sent", None
        elif e["op"] == "release":
            n.status, n.claim, n.claimed_at, n.attempts, n.next_attempt_at = (
                "owed",
                None,
                None,
                n.attempts - 1,
                now,
            )
        else:
            backoff = min(NOTICE_BACKOFF_MAX, NOTICE_BACKOFF_BASE * 2 ** (min(n.attempts, 30) - 1))
            n.status, n.claim, n.claimed_at, n.next_attempt_at = "owed", None, None, now + backoff

    def learn_notice(
        self, key: tuple[str, date, int], status: str, attempts: int, next_attempt_at: datetime
    ) -> None:
        """A notice no worker touched yet (created by a crossing): it must be owed, untried."""
        if key not in self.notices:
            if (status, attempts) != ("owed", 0):
                raise Mismatch(
                    f"notice {key} is {status} after {attempts} attempts, but no worker claimed it"
                )
            self.notices[key] = Notice(next_attempt_at=next_attempt_at)

    # ------------------------------------------------------------ what the database must show

    def periods(self) -> dict[tuple[str, date], tuple[int, int, int, int]]:
        out = {}
        for key, allowance in self.allowances.items():
            rows = [r for r in self.requests.values() if (r.org, r.period) == key]
            used = sum(r.charged for r in rows if r.status not in OPEN)
            held = sum(r.estimate for r in rows if r.status in OPEN)
            cents = sum(r.cents or 0 for r in rows if r.status not in OPEN)
            out[key] = (allowance, used, held, cents)
        return out

    def invocations(self) -> dict[str, tuple]:
        return {inv: (r.status, r.kind, r.charged, r.cents, r.period, r.alerted, r.late, r.recovered,
                      *(r.ids.get(s) for s in SCOPE_IDS), r.mask)
                for inv, r in self.requests.items()}  # fmt: skip

    def executions(self) -> dict[str, tuple]:
        """Each task's status and totals: its terminal requests' count and charges, also
        after it closed (WF-PFM-LLM-002 hop 3)."""
        out = {}
        for key, task in self.tasks.items():
            done = [r for r in self.requests.values() if r.task == key and r.status not in OPEN]
            out[key] = (task.status, len(done), sum(r.charged for r in done), sum(r.cents or 0 for r in done),
                        task.status != "running")  # fmt: skip
        return out

    def notice_states(self) -> dict[tuple[str, date, int], tuple[str, int]]:
        return {k: (n.status, n.attempts) for k, n in self.notices.items()}

    def required_notices(self) -> set[tuple[str, date, int]]:
        """Every (org, period, threshold) whose level used stands at or above must have its
        notice: reached by a movement, or put there by an allowance or threshold change.
        A period older than the organization's last change keeps the
        right to miss a threshold that change added (it never crossed it)."""
        out = set()
        for (org, start), (allowance, used, _, _) in self.periods().items():
            o = self.orgs[org]
            for pct in o.thresholds:
                always = all(pct in lst for lst in o.lists)
                current = o.changed_month is None or start >= o.changed_month
                if used * 100 >= pct * allowance and (always or current):
                    out.add((org, start, pct, *ALLOWANCE))
        return out | self._required_budget_notices()

    def _required_budget_notices(self) -> set[tuple]:
        """A counter's notices for the thresholds its used stands at or above, where the
        budget that applies to it was set once and never replaced, removed or shadowed
        (own <-> '*'): then every movement it counted crossed under that budget
        (docs/architecture.md "Budgets"). A changed budget owes only in the window of its set_budget's clock, and
        the model keeps no clock of those: it requires nothing there."""
        out = set()
        for (org, scope, sid, window, start), (used, _, _) in self.counters().items():
            own = (org, scope, sid, window)
            star = None if scope == "organization" else (org, scope, "*", window)
            applying = own if own in self.budgets else star if star in self.budgets else None
            other = star if applying == own else own
            if (
                applying is None
                or self.budget_sets[applying] != 1
                or (other and other in self.budget_sets)
            ):
                continue
            limit, thresholds = self.budgets[applying]
            out |= {
                (org, start, pct, scope, sid, window)
                for pct in thresholds
                if used * 100 >= pct * limit
            }
        return out

    def counters(self) -> dict[tuple, tuple[int, int, int]]:
        """Each budget counter's used, held and cents: the sums over the requests admitted
        under it (invariant 14)."""
        out: dict[tuple, tuple[int, int, int]] = {}
        for r in self.requests.values():
            for key in self._counter_keys(r):
                used, held, cents = out.get(key, (0, 0, 0))
                if r.status in OPEN:
                    out[key] = (used, held + r.estimate, cents)
                else:
                    out[key] = (used + r.charged, held, cents + (r.cents or 0))
        return {k: v for k, v in out.items() if k not in self.purged}

    def sweep_totals(self) -> dict[str, tuple[int, int, int]]:
        out = {}
        for org in self.orgs:
            rows = [r for r in self.requests.values() if r.org == org]
            out[org] = (sum(r.recovered is not None for r in rows),
                        sum(r.recovered == 0 and r.estimate > 0 for r in rows),
                        sum(r.alerted for r in rows))  # fmt: skip
        return out

    def daily(self) -> dict[tuple[str, date, str], tuple[int, ...]]:
        out: dict[tuple[str, date, str], tuple[int, ...]] = {}
        for r in self.requests.values():
            if r.settled_at is None:
                continue
            key = (r.org, r.settled_at.astimezone(UTC).date(), r.model)
            n, rec, credits, cents, t_in, t_out = out.get(key, (0,) * 6)
            tokens = r.tokens or 0
            out[key] = (n + 1, rec + (r.kind in ("recovered", "trued_up")), credits + r.charged,
                        cents + (r.cents or 0), t_in + tokens, t_out + tokens)  # fmt: skip
        return out
