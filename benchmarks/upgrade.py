"""The upgrade from the previous release under live traffic, by hand:

    .venv/bin/python -m benchmarks.upgrade                 # 1 M requests, about 5 minutes
    .venv/bin/python -m benchmarks.upgrade --requests 200000
    .venv/bin/python -m benchmarks.upgrade --from 0.1.0      # each migration since 0.1.0

Release 0.3.0 (tests/upgrade/llm-db-0.3.0-1a824af.tar.gz) is installed and populated as
tests/test_upgrade_live.py does it, with ``--requests`` settled requests over 200
organizations, on a server with PostgreSQL's durability defaults (benchmarks/server.py).
Three copies of that database are upgraded to this checkout, each with 8 clients and a task
client looping through 0.3.0's SQL:

1. step by step: one ``migrate``, its steps (each migration, the barrier, the function
   files, each contract step) told apart by its events, while a sampler reads
   ``pg_locks`` every few milliseconds: which tables of schema llm each step locks, in
   which mode, and for how long (sampled, so a lock held for less than a sample can be
   missed);
2. one plain ``migrate``: its duration, the clients' calls, errors and worst wait;
3. the same with a consumer transaction (it read llm.settings and llm.threshold_notices)
   left open for 3 s while migrate needs those tables.

With ``--from 0.1.0``, 0.1.0's books (its tables: period counters and ledger rows) are
upgraded step by step with the sampler and no traffic.
"""

from __future__ import annotations

import argparse
import subprocess
import tarfile
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

import psycopg

from benchmarks.server import Target, open_target
from llm_db.migrate import Event, migrate
from tests.helpers import T0
from tests.test_upgrade_live import CLIENTS, ORGS, RELEASE_0_3_0, Client, Traffic, install_release

APP = "llm-db bench upgrade"
ROOT = Path(__file__).resolve().parent.parent
# In PostgreSQL's order of strength, weakest first.
MODES = ["AccessShareLock", "RowShareLock", "RowExclusiveLock", "ShareUpdateExclusiveLock",
         "ShareLock", "ShareRowExclusiveLock", "ExclusiveLock", "AccessExclusiveLock"]  # fmt: skip
LOCKS = """
SELECT c.relname, l.mode, l.granted
  FROM pg_locks AS l
  JOIN pg_stat_activity AS a ON a.pid = l.pid
  JOIN pg_class AS c ON c.oid = l.relation
 WHERE a.application_name = %s AND l.locktype = 'relation'
   AND c.relnamespace = 'llm'::regnamespace AND c.relkind IN ('r', 'v', 'p')
"""


class LockSampler:
    """Polls the locks migrate's connections hold on llm's tables and views, by step."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.step = ""
        self.seen: dict[
            tuple[str, str, str], list[float]
        ] = {}  # (step, table, mode) -> [first, last]
        self.waited: set[tuple[str, str, str]] = set()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self.done.is_set():
                now, step = time.monotonic(), self.step
                for table, mode, granted in conn.execute(LOCKS, [APP]).fetchall():
                    key = (step, table, mode)
                    if not granted:
                        self.waited.add(key)
                    self.seen.setdefault(key, [now, now])[1] = now
                time.sleep(0.003)  # a sampling period, not a synchronization

    def locks(self, step: str) -> str:
        """``table MODE ~held s, ...`` of ``step``: every mode seen on each table, weakest
        first (a migration that reads a table, then drops or alters it, shows both)."""
        seen = sorted((table, MODES.index(mode), mode, last - first)
                      for (s, table, mode), (first, last) in self.seen.items() if s == step)  # fmt: skip
        tables: dict[str, list[str]] = {}
        for table, _, mode, held in seen:
            waited = " (waited)" if (step, table, mode) in self.waited else ""
            tables.setdefault(table, []).append(
                f"{mode.removesuffix('Lock')}{waited} ~{held:.2f} s"
            )
        return "; ".join(f"{t} {', '.join(modes)}" for t, modes in tables.items()) or "none seen"


def start_traffic(dsn: str) -> Traffic:
    orgs = [uuid.UUID(f"00000000-0000-4000-8000-{i:012d}") for i in range(1, ORGS + 1)]
    clients = [Client(dsn, orgs[i::CLIENTS], prepare=i == CLIENTS - 1) for i in range(CLIENTS)]
    clients.append(Client(dsn, orgs[:10], tasks=True))
    live = Traffic(clients, [c.start() for c in clients])
    live.run_for(500)
    return live


def summary(live: Traffic) -> str:
    live.stop()
    errors = [e for c in live.clients for e in c.errors]
    worst = max(c.worst for c in live.clients)
    first = f" (first: {errors[0]})" if errors else ""
    return f"{live.calls} client calls, {len(errors)} errors{first}, worst wait {worst:.3f} s"


def step_by_step(dsn: str, *, traffic: bool = True) -> None:
    """One ``migrate`` whose every step (each migration, the barrier, the function files,
    each contract step) the sampler tells apart by migrate's own events."""
    app_dsn = f"{dsn} application_name='{APP}'"
    sampler = LockSampler(dsn)
    sampler.thread.start()
    live = start_traffic(dsn) if traffic else None
    print("| step | duration | what it locks (each mode, sampled time held) |")
    print("|---|---|---|")

    def on_event(event: Event) -> None:
        if event["event"] == "start":
            sampler.step = event["step"]
        elif event["event"] == "done":
            print(f"| {event['step']} | {event['elapsed_s']:.2f} s | {sampler.locks(event['step'])} |")

    migrate(app_dsn, on_event=on_event)
    sampler.done.set()
    if live is not None:
        print(f"traffic meanwhile: {summary(live)}")


def plain(dsn: str) -> None:
    live = start_traffic(dsn)
    started = time.monotonic()
    migrate(dsn)
    seconds = time.monotonic() - started
    live.run_for(500)
    print(f"migrate under traffic: {seconds:.2f} s; {summary(live)}")


def with_open_transaction(dsn: str, hold: float = 3.0) -> None:
    live = start_traffic(dsn)
    with psycopg.connect(dsn) as holder:
        holder.execute("SELECT * FROM llm.settings")
        holder.execute("SELECT count(*) FROM llm.threshold_notices")
        started = time.monotonic()
        upgrade = threading.Thread(target=lambda: migrate(dsn))
        upgrade.start()
        time.sleep(hold)  # the consumer's transaction stays open this long: the scenario itself
        holder.rollback()
    upgrade.join()
    seconds = time.monotonic() - started
    live.run_for(500)
    print(f"migrate with a transaction open {hold:.0f} s: {seconds:.2f} s; {summary(live)}")


# 0.1.0's books (migrations 0001-0003): the period counters a table, the ledger a table of
# one hold, one release and one charge row per request, exactly what 0008 derives.
POPULATE_0_1_0 = [
    """INSERT INTO llm.organizations (id, name, monthly_allowance_credits, created_at, updated_at)
       SELECT ('00000000-0000-4000-8000-' || lpad(g::text, 12, '0'))::uuid, 'org ' || g, NULL,
              %(start)s, %(start)s
         FROM generate_series(1, %(orgs)s) AS g""",
    """INSERT INTO llm.invocations (organization_id, id, period_start, model, status,
                                   estimate_credits, hold_credits, charged_credits, charged_cents,
                                   input_tokens, output_tokens, settlement_kind, created_at,
                                   dispatched_at, settled_at)
       SELECT ('00000000-0000-4000-8000-' || lpad((1 + g %% %(orgs)s)::text, 12, '0'))::uuid,
              gen_random_uuid(), %(period)s, 'gpt-x', 'settled', 10, 10, 1 + g %% 10, g %% 3,
              100, 20, 'measured', %(start)s + (g %% 1000000) * interval '1 second',
              %(start)s + (g %% 1000000) * interval '1 second',
              %(start)s + (g %% 1000000) * interval '1 second' + interval '1 second'
         FROM generate_series(1, %(requests)s) AS g""",
    """INSERT INTO llm.ledger (organization_id, invocation_id, entry, period_start, credits, cents,
                              recorded_at)
       SELECT i.organization_id, i.id, e.entry, i.period_start, e.credits, e.cents, e.at
         FROM llm.invocations AS i
        CROSS JOIN LATERAL (VALUES ('hold', i.hold_credits, NULL::bigint, i.created_at),
                                   ('release', i.hold_credits, NULL::bigint, i.settled_at),
                                   ('charge', i.charged_credits, i.charged_cents, i.settled_at))
              AS e(entry, credits, cents, at)""",
    """INSERT INTO llm.periods (organization_id, period_start, period_end, allowance_credits,
                               used_credits, held_credits, used_cents)
       SELECT organization_id, period_start, (period_start + interval '1 month')::date, NULL,
              sum(charged_credits), 0, sum(charged_cents)
         FROM llm.invocations GROUP BY organization_id, period_start""",
    "ANALYZE",
]


def install_0_1_0(dsn: str, target: Path, requests: int) -> None:
    """Release 0.1.0 (tests/upgrade/) at ``dsn``, with ``requests`` settled requests."""
    with tarfile.open(ROOT / "tests" / "upgrade" / "llm-db-0.1.0-fd1a650.tar.gz") as archive:
        archive.extractall(target, filter="data")
    migrate(dsn, migrations_dir=target / "migrations", sql_dir=target / "sql")
    values = {"orgs": ORGS, "requests": requests, "start": T0 - timedelta(days=14),
              "period": T0.date().replace(day=1)}  # fmt: skip
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in POPULATE_0_1_0:
            conn.execute(statement, values)
        assert conn.execute("SELECT * FROM llm.check_invariants()").fetchall() == []


def from_0_1_0(target: Target, requests: int, tmp: Path) -> None:
    """0.1.0's books upgraded step by step, without traffic: 0.1.0's functions fail
    against the schema of 0005-0009 until the new ones are live."""
    started = time.monotonic()
    dsn = target.create_database("u010")
    install_0_1_0(dsn, tmp / "0.1.0", requests)
    print(f"0.1.0 installed and populated in {time.monotonic() - started:.0f} s")
    step_by_step(dsn, traffic=False)
    target.drop_database("u010")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.upgrade", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument(
        "--dsn", help="use this server (needs CREATEDB) instead of an ephemeral one"
    )
    parser.add_argument("--from", dest="release", choices=["0.3.0", "0.1.0"], default="0.3.0",
                        help="0.1.0: its books upgraded step by step, without traffic")  # fmt: skip
    args = parser.parse_args(argv)
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()  # fmt: skip
    print(
        f"upgrade {args.release} -> {commit}, {args.requests:,} requests, {time.strftime('%Y-%m-%d')}"
    )
    with open_target(args.dsn) as target, tempfile.TemporaryDirectory() as tmp:
        if args.release == "0.1.0":
            from_0_1_0(target, args.requests, Path(tmp))
            return 0
        started = time.monotonic()
        install_release(RELEASE_0_3_0, target.create_database("u030"), Path(tmp), requests=args.requests)
        print(f"0.3.0 installed and populated in {time.monotonic() - started:.0f} s")
        for name, scenario in (
            ("steps", step_by_step),
            ("plain", plain),
            ("open", with_open_transaction),
        ):
            scenario(target.create_database(name, template="u030"))
            target.drop_database(name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
