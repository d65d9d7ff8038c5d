"""The demo's traffic (``llm-db demo``, ``llm_db.demo``): its cast of organizations,
a seeded plan of requests and tasks per worker, and the worker threads that send it
through the Python driver, some failing at the provider and some crashing after a
dispatch. Globex's requests name a project and an end user of its app, under a
project budget and a default end-user budget (``BUDGETS``). Every request is
priced by the book (``PRICES``): admitted with its token counts, settled with the
provider's usage (``llm_db.Usage``), charged ceil(cost / ``NANOS_PER_CREDIT``) credits."""

from __future__ import annotations

import contextlib
import dataclasses
import random
import threading
import uuid
from collections import Counter
from datetime import datetime, timedelta

import psycopg

from llm_db import errors
from llm_db.client import Llm
from llm_db.executions import ExecutionContext, with_llm_execution
from llm_db.usage import Usage

DAY = timedelta(hours=24)  # the simulated day of traffic
TOTAL_ITEMS = 216  # single requests or tasks, shared out between the workers

# ----------------------------------------------------------- the cast


@dataclasses.dataclass(frozen=True, slots=True)
class DemoOrg:
    key: str
    name: str
    allowance: int | None
    status: str
    weight: int
    id: uuid.UUID


def _organizations() -> list[DemoOrg]:
    return [
        DemoOrg("acme", "Acme Research", 24_000, "operational", 9, uuid.uuid4()),
        DemoOrg("globex", "Globex", None, "operational", 9, uuid.uuid4()),
        DemoOrg("initech", "Initech", 50_000, "suspended", 2, uuid.uuid4()),
    ]


# Globex's budgets: (scope, id, window, limit credits). Its allowance is
# unlimited, so what refuses its requests is these: the search project's month,
# and every end user's day ('*': the default of each id without its own).
BUDGETS = (
    ("project", "search", "month", 9_000),
    ("end_user", "*", "day", 1_500),
)
PROJECTS = ("search", "support")
END_USERS = tuple(f"user-{n:02d}" for n in range(1, 13))

TASK_KINDS = {
    "demo.summarize": "Summarize a document in a few model calls",
    "demo.translate": "Translate a document section by section",
}

# The price book, per million tokens of each class, as the providers publish
# them: OpenAI's GPT-4o, Anthropic's Claude Sonnet 4, a hosted Llama 3.3 70B (no cache).
# Set as each demo organization's own versions, so a demo on a real database (--dsn)
# leaves the book's prices as they are.
PRICES = {
    "gpt-4o": {"input": "2.50", "cache_read": "1.25", "output": "10"},
    "claude-sonnet": {"input": "3", "cache_write_5m": "3.75", "cache_read": "0.30", "output": "15"},
    "llama-70b": {"input": "0.59", "output": "0.79"},
}
MODELS = tuple(PRICES)
NANOS_PER_CREDIT = 30_000  # a credit is worth $0.00003: the plans' requests cost tens to hundreds

# ----------------------------------------------------------- the plan (seeded)


@dataclasses.dataclass(frozen=True, slots=True)
class PlannedRequest:
    model: str
    size: int  # scales its tokens
    outcome: str  # settle | fail | crash
    usage_ratio: float  # measured output tokens / the most it may write (a float of the plan, never money)
    latency_s: float
    input_tokens: int
    output_tokens: int  # the most it may write (max_output_tokens)

    def usage(self) -> Usage:
        """What the provider measured: a quarter of the prompt read from its cache (where
        the model's price has a cache rate), the output a share of the most it could write."""
        cached = self.input_tokens // 4 if "cache_read" in PRICES[self.model] else 0
        return Usage(input=self.input_tokens - cached, cache_read=cached,
                     output=round(self.output_tokens * self.usage_ratio))


@dataclasses.dataclass(frozen=True, slots=True)
class Item:
    at: timedelta  # after the start of the day
    org: str
    kind: str  # single | task | stuck_task
    task_key: str | None
    body_raises: bool
    requests: tuple[PlannedRequest, ...]
    project: str | None = None  # the scope ids its requests name (Globex's only)
    end_user: str | None = None


def _request(rng: random.Random, *, may_crash: bool) -> PlannedRequest:
    roll = rng.random()
    outcome = "crash" if may_crash and roll < 0.06 else "fail" if roll < 0.11 else "settle"
    size = rng.randint(40, 400)
    return PlannedRequest(
        model=rng.choice(list(MODELS)),
        size=size,
        outcome=outcome,
        usage_ratio=rng.uniform(0.55, 1.1),
        latency_s=rng.uniform(1.0, 30.0),
        input_tokens=size * rng.randint(3, 8),
        output_tokens=size * rng.randint(1, 3),
    )


def plan_traffic(seed: int, workers: int, orgs: list[DemoOrg]) -> list[list[Item]]:
    """Each worker's items, in time order; worker 0 also gets the task that stays running."""
    per_worker = max(1, TOTAL_ITEMS // workers)
    keys = [o.key for o in orgs]
    weights = [o.weight for o in orgs]
    plans = []
    for w in range(workers):
        rng = random.Random(f"llm-db demo {seed} worker {w}")
        # drawn apart, so the scopes leave the rest of the plan as it was
        scopes = random.Random(f"llm-db demo {seed} worker {w} scopes")
        offsets = sorted(rng.uniform(0, DAY.total_seconds() - 900) for _ in range(per_worker))
        items = []
        for n, offset in enumerate(offsets):
            org = rng.choices(keys, weights)[0]
            if w == 0 and n == per_worker // 2:
                requests = tuple(_request(rng, may_crash=False) for _ in range(2))
                requests = tuple(dataclasses.replace(r, outcome="settle") for r in requests)
                items.append(Item(timedelta(seconds=offset), "globex", "stuck_task",
                                  "demo.summarize", False, requests))  # fmt: skip
            elif rng.random() < 0.25:
                requests = tuple(_request(rng, may_crash=False) for _ in range(rng.randint(2, 4)))
                items.append(Item(timedelta(seconds=offset), org, "task", rng.choice(list(TASK_KINDS)),
                                  rng.random() < 0.15, requests))  # fmt: skip
            else:
                items.append(Item(timedelta(seconds=offset), org, "single", None, False,
                                  (_request(rng, may_crash=True),)))  # fmt: skip
            project, end_user = scopes.choice(PROJECTS), scopes.choice(END_USERS)
            if org == "globex" and items[-1].kind != "stuck_task":
                items[-1] = dataclasses.replace(items[-1], project=project, end_user=end_user)
        plans.append(items)
    return plans


# ----------------------------------------------------------- the workers


class _ToolError(RuntimeError):
    """What a task body raises when the simulated tool fails."""


@dataclasses.dataclass
class Tally:
    """What the workers did, per organization key, plus task outcomes."""

    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    by_org: dict[str, Counter[str]] = dataclasses.field(default_factory=dict)
    tasks: Counter[str] = dataclasses.field(default_factory=Counter)

    def add(self, org: str, what: str, n: int = 1) -> None:
        with self.lock:
            self.by_org.setdefault(org, Counter())[what] += n

    def task(self, what: str) -> None:
        with self.lock:
            self.tasks[what] += 1


class _Clock:
    """A worker's simulated time; callable, so ``with_llm_execution(now=clock)`` reads it."""

    def __init__(self, start: datetime) -> None:
        self.t = start

    def __call__(self) -> datetime:
        return self.t

    def advance(self, seconds: float) -> datetime:
        self.t += timedelta(seconds=seconds)
        return self.t


class _Worker(threading.Thread):
    def __init__(
        self,
        index: int,
        dsn: str,
        items: list[Item],
        orgs: dict[str, DemoOrg],
        day_start: datetime,
        tally: Tally,
        stop: threading.Event,
    ) -> None:
        super().__init__(name=f"llm-db demo worker {index}", daemon=True)
        self.dsn = dsn
        self.items = items
        self.orgs = orgs
        self.day_start = day_start
        self.tally = tally
        self.stop = stop
        self.error: BaseException | None = None
        self.conn: psycopg.Connection | None = None
        self.llm: Llm | None = None

    # a fresh process after a crash: a new connection
    def _connect(self) -> Llm:
        self.conn = psycopg.connect(
            self.dsn, autocommit=True, prepare_threshold=None, application_name="llm-db demo"
        )
        self.llm = Llm(self.conn)
        return self.llm

    def _crash(self) -> None:
        assert self.conn is not None
        self.conn.close()  # whatever it had in flight is never settled
        self._connect()

    def run(self) -> None:
        try:
            self._connect()
            clock = _Clock(self.day_start)
            for item in self.items:
                if self.stop.is_set():
                    return
                clock.t = max(clock.t, self.day_start + item.at)
                self._item(item, clock)
        except BaseException as exc:
            self.error = exc
        finally:
            if self.conn is not None:
                self.conn.close()

    def _item(self, item: Item, clock: _Clock) -> None:
        org = self.orgs[item.org]
        if item.kind == "single":
            with contextlib.suppress(errors.AllowanceExhausted, errors.OrganizationNotOperational):
                self._send(
                    org, item.requests[0], clock, project=item.project, end_user=item.end_user
                )
        elif item.kind == "task":
            self._task(org, item, clock)
        else:
            self._stuck_task(org, item, clock)

    def _send(
        self,
        org: DemoOrg,
        req: PlannedRequest,
        clock: _Clock,
        execution_id: uuid.UUID | None = None,
        *,
        project: str | None = None,
        end_user: str | None = None,
    ) -> None:
        """One model request: admit, dispatch, then settle, fail or crash."""
        llm = self.llm
        assert llm is not None
        try:  # no estimate: the book prices the prompt and the most output at the price in force
            inv = llm.admit(org.id, None, req.model, execution_id=execution_id, now=clock.t,
                            project=project, end_user=end_user, input_tokens=req.input_tokens,
                            max_output_tokens=req.output_tokens)  # fmt: skip
        except errors.AllowanceExhausted as exc:
            refused = "refused_budget" if _refused_by_budget(exc) else "refused_allowance"
            self.tally.add(org.key, refused)
            raise
        except errors.OrganizationNotOperational:
            self.tally.add(org.key, "refused_suspended")
            raise
        self.tally.add(org.key, "admitted")
        llm.mark_dispatched(org.id, inv.id, now=clock.advance(0.2))
        clock.advance(req.latency_s)
        if req.outcome == "crash":
            self.tally.add(org.key, "crashed")
            self.tally.add(org.key, "crashed_hold_credits", inv.hold_credits)
            self._crash()
        elif req.outcome == "fail":
            llm.fail(org.id, inv.id, "provider answered 503 Service Unavailable", now=clock.t)
            self.tally.add(org.key, "failed")
        else:  # the provider's usage, priced at the price the admission pinned
            llm.settle_usage(org.id, inv.id, req.usage(), now=clock.t)
            self.tally.add(org.key, "settled")

    def _task(self, org: DemoOrg, item: Item, clock: _Clock) -> None:
        assert item.task_key is not None and self.llm is not None

        def body(ctx: ExecutionContext) -> None:
            for n, req in enumerate(item.requests):
                self._send(org, req, clock, execution_id=ctx.execution_id,
                           project=item.project, end_user=item.end_user)  # fmt: skip
                if item.body_raises and n == len(item.requests) - 2:
                    raise _ToolError("the document store timed out")

        try:
            with_llm_execution(self.llm, org.id, item.task_key, body, now=clock,
                               subject_type="document", subject_id=f"doc-{clock.t:%H%M%S}")  # fmt: skip
        except errors.OrganizationNotOperational:
            self.tally.add(org.key, "refused_suspended")
        except errors.AllowanceExhausted:
            self.tally.task("failed")  # the body ran out of allowance: the task failed
        except _ToolError:
            self.tally.task("failed")
        else:
            self.tally.task("completed")

    def _stuck_task(self, org: DemoOrg, item: Item, clock: _Clock) -> None:
        """A worker dies inside a task: its requests settled, the task never closed."""
        assert item.task_key is not None and self.llm is not None
        opened = self.llm.open_execution(org.id, item.task_key, subject_type="document",
                                         subject_id="doc-stuck", now=clock.t)  # fmt: skip
        for req in item.requests:
            self._send(org, req, clock, execution_id=opened.execution_id)
        self.tally.task("left_running")
        self._crash()


def _refused_by_budget(exc: errors.AllowanceExhausted) -> bool:
    """Whether an LL001 named a budget rather than the allowance, as the driver reads it
    (under Citus, which drops the diagnostic TABLE, from the DETAIL): the allowance is
    the organization's month, a budget any other scope or window."""
    return exc.scope is not None and (exc.scope, exc.window) != ("organization", "month")


def _run_workers(
    dsn: str, plans: list[list[Item]], orgs: dict[str, DemoOrg], day_start: datetime
) -> Tally:
    tally = Tally()
    stop = threading.Event()
    workers = [
        _Worker(i, dsn, items, orgs, day_start, tally, stop) for i, items in enumerate(plans)
    ]
    for w in workers:
        w.start()
    try:
        for w in workers:
            while w.is_alive():
                w.join(0.2)
    except BaseException:
        stop.set()
        for w in workers:
            w.join(30)
        raise
    for w in workers:
        if w.error is not None:
            raise w.error
    return tally
