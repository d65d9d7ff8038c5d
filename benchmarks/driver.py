"""The request cycle through the Python driver: 8 threads, and 8 asyncio tasks.

Each worker has its own connection (autocommit) and loops until the deadline:
pick a random organization, ``admit`` a request linked to that organization's
running task with a client-chosen id, ``settle`` it. The same cycle as
``scripts/cycle.sql``, so its rate compares with the SQL-level one.

``client_instructions`` counts what the client's process executes per cycle on one
connection, under valgrind's callgrind: unlike a rate or a CPU time on a shared VM,
the count hardly moves from run to run. It runs this module:

    python -m benchmarks.driver DSN CYCLES ORGS driver|bare threads|asyncio [prepared]
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import re
import shutil
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

try:  # the project's driver
    from llm_db.client import AsyncLlm, Llm

    VIA = "llm_db.client (Llm / AsyncLlm)"
except ImportError:  # pragma: no cover - only before the driver existed
    Llm = AsyncLlm = None
    VIA = "psycopg, calling the SQL functions directly (llm_db.client not importable)"

WARMUP_CYCLES = 20
SLOTS = 8  # running tasks per organization (queries.OPEN_TASKS: one per client slot)


def org_id(n: int) -> uuid.UUID:
    """Organization n's id, as ``md5('bench-org-' || n)::uuid`` computes it in SQL."""
    return uuid.UUID(hashlib.md5(f"bench-org-{n}".encode()).hexdigest())


def exec_id(n: int, slot: int = 0) -> uuid.UUID:
    """Organization n's running task of client slot ``slot``, as
    ``md5('bench-exec-' || n || '-' || slot)::uuid`` (queries.OPEN_TASKS)."""
    return uuid.UUID(hashlib.md5(f"bench-exec-{n}-{slot}".encode()).hexdigest())


@dataclass
class DriverRun:
    mode: str
    workers: int
    seconds: float
    requests: int
    errors: int
    #: CPU of this (the client's) process over the timed run, all its threads
    cpu_seconds: float = 0.0

    @property
    def rate(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    @property
    def cpu_us_per_request(self) -> float | None:
        return self.cpu_seconds / self.requests * 1e6 if self.requests else None


# The bare client sends the driver's own two statements with the parameters the driver
# binds ("bare psycopg running the same statements"), so the ratio of
# the two is the layer's cost alone: argument checks, the connection and transaction
# handling, errors, and reading the row.
try:
    from llm_db._client_methods import ADMIT_ID as _ADMIT
    from llm_db._client_methods import SETTLE as _SETTLE
except ImportError:  # pragma: no cover - only before the generated methods existed
    _ADMIT = (
        "SELECT i.id FROM llm.admit_invocation(%(organization_id)s::uuid, 100, 'bench-model',"
        " %(execution_id)s::uuid, %(invocation_id)s::uuid) AS i"
    )
    _SETTLE = "SELECT llm.settle_invocation(%(organization_id)s::uuid, %(invocation_id)s::uuid, 80, 3, 1200, 300)"


def _admit_params(org: uuid.UUID, task: uuid.UUID, inv: uuid.UUID) -> dict[str, Any]:
    return {"organization_id": org, "estimate_credits": 100, "model": "bench-model", "execution_id": task,
            "invocation_id": inv, "now": None, "project": None, "api_key": None, "end_user": None,
            "input_tokens": None, "max_output_tokens": None}  # fmt: skip


def _settle_params(org: uuid.UUID, inv: uuid.UUID) -> dict[str, Any]:
    return {"organization_id": org, "invocation_id": inv, "credits": 80, "cents": 3,
            "input_tokens": 1200, "output_tokens": 300, "now": None}  # fmt: skip


def _one_cycle(client: Any, conn: psycopg.Connection, n: int, slot: int, prepare: bool | None) -> None:
    org, task, inv = org_id(n), exec_id(n, slot), uuid.uuid4()
    if client is not None:
        # only the id back, as the SQL-level cycle (scripts/cycle.sql) reads it
        admitted = client.admit_id(org, 100, "bench-model", execution_id=task, invocation_id=inv)
        client.settle(org, admitted, 80, 3, input_tokens=1200, output_tokens=300)
    else:
        with conn.cursor() as cur:
            cur.execute(_ADMIT, _admit_params(org, task, inv), prepare=prepare)
            admitted = cur.fetchone()[0]
            cur.execute(_SETTLE, _settle_params(org, admitted), prepare=prepare)
            cur.fetchone()


async def _one_cycle_async(
    client: Any, conn: psycopg.AsyncConnection, n: int, slot: int, prepare: bool | None
) -> None:
    org, task, inv = org_id(n), exec_id(n, slot), uuid.uuid4()
    if client is not None:
        admitted = await client.admit_id(org, 100, "bench-model", execution_id=task, invocation_id=inv)
        await client.settle(org, admitted, 80, 3, input_tokens=1200, output_tokens=300)
    else:
        async with conn.cursor() as cur:
            await cur.execute(_ADMIT, _admit_params(org, task, inv), prepare=prepare)
            admitted = (await cur.fetchone())[0]
            await cur.execute(_SETTLE, _settle_params(org, admitted), prepare=prepare)
            await cur.fetchone()


def run_threads(
    dsn: str, *, workers: int, seconds: float, orgs: int, bare: bool = False, prepare: bool = False
) -> DriverRun:
    """``workers`` threads, one connection each, for ``seconds``. ``bare``: the driver's
    two statements through psycopg alone (no llm_db layer) at the driver's prepare
    setting: psycopg's default (prepared after five executions) with ``prepare``,
    ``execute(..., prepare=False)`` without it, as the driver does: the floor of any Python client in either mode. Otherwise the
    driver, ``Llm(conn, prepare=prepare)`` (``prepare=True``: server-side prepared
    statements, not for transaction pooling)."""
    counts = [0] * workers
    errors = [0] * workers
    ready = threading.Barrier(workers + 1)
    start_at: list[float] = []

    def work(k: int) -> None:
        rng = random.Random(k)
        with psycopg.connect(dsn, autocommit=True) as conn:
            client = Llm(conn, prepare=prepare) if Llm is not None and not bare else None
            mode = None if prepare else False  # the driver's: psycopg's default, or never
            for _ in range(WARMUP_CYCLES):
                _one_cycle(client, conn, rng.randint(1, orgs), k % SLOTS, mode)
            ready.wait()
            deadline = start_at[0] + seconds
            while time.perf_counter() < deadline:
                try:
                    _one_cycle(client, conn, rng.randint(1, orgs), k % SLOTS, mode)
                    counts[k] += 1
                except Exception:  # counted and reported; the run goes on
                    errors[k] += 1

    threads = [threading.Thread(target=work, args=(k,), daemon=True) for k in range(workers)]
    for t in threads:
        t.start()
    start_at.append(time.perf_counter() + 0.05)
    ready.wait()
    cpu_start = time.process_time()
    for t in threads:
        t.join()
    elapsed = max(time.perf_counter() - start_at[0], 1e-9)
    cpu = time.process_time() - cpu_start
    mode = ("threads, bare psycopg" if bare else "threads") + (", prepared" if prepare else "")
    return DriverRun(mode, workers, elapsed, sum(counts), sum(errors), cpu)


def run_asyncio(
    dsn: str, *, workers: int, seconds: float, orgs: int, bare: bool = False, prepare: bool = False
) -> DriverRun:
    """``workers`` asyncio tasks on one event loop, one connection each, for ``seconds``;
    ``bare`` and ``prepare`` as for ``run_threads``."""

    async def main() -> DriverRun:
        conns = [await psycopg.AsyncConnection.connect(dsn, autocommit=True) for _ in range(workers)]
        try:
            clients = [AsyncLlm(c, prepare=prepare) if AsyncLlm is not None and not bare else None
                       for c in conns]  # fmt: skip
            rngs = [random.Random(100 + k) for k in range(workers)]
            mode = None if prepare else False  # the driver's: psycopg's default, or never
            await asyncio.gather(*(
                _warm(clients[k], conns[k], rngs[k]) for k in range(workers)
            ))  # fmt: skip
            counts = [0] * workers
            errors = [0] * workers
            start, cpu_start = time.perf_counter(), time.process_time()
            deadline = start + seconds

            async def loop(k: int) -> None:
                while time.perf_counter() < deadline:
                    try:
                        await _one_cycle_async(clients[k], conns[k], rngs[k].randint(1, orgs), k % SLOTS,
                                               mode)  # fmt: skip
                        counts[k] += 1
                    except Exception:  # counted and reported; the run goes on
                        errors[k] += 1

            await asyncio.gather(*(loop(k) for k in range(workers)))
            elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
            label = ("asyncio, bare psycopg" if bare else "asyncio") + (", prepared" if prepare else "")
            return DriverRun(label, workers, elapsed, sum(counts), sum(errors), cpu)
        finally:
            for c in conns:
                await c.close()

    async def _warm(client: Any, conn: psycopg.AsyncConnection, rng: random.Random) -> None:
        for _ in range(WARMUP_CYCLES):
            await _one_cycle_async(client, conn, rng.randint(1, orgs), 0, None if prepare else False)

    return asyncio.run(main())


def cycles(dsn: str, n: int, *, bare: bool, asynchronous: bool, prepare: bool, orgs: int) -> None:
    """``n`` request cycles in a row on one autocommit connection, after the warm-up."""
    rng, mode = random.Random(7), None if prepare else False
    if not asynchronous:
        with psycopg.connect(dsn, autocommit=True) as conn:
            client = None if bare else Llm(conn, prepare=prepare)
            for _ in range(WARMUP_CYCLES + n):
                _one_cycle(client, conn, rng.randint(1, orgs), 0, mode)
        return

    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            client = None if bare else AsyncLlm(conn, prepare=prepare)
            for _ in range(WARMUP_CYCLES + n):
                await _one_cycle_async(client, conn, rng.randint(1, orgs), 0, mode)

    asyncio.run(main())


_COLLECTED = re.compile(r"Collected : (\d+)")


def client_instructions(dsn: str, *, bare: bool, asynchronous: bool, prepare: bool, orgs: int,
                        counts: tuple[int, int] = (100, 400)) -> float | None:  # fmt: skip
    """Instructions the client's process executes per request cycle (``cycles`` under
    callgrind, the difference between a run of ``counts[1]`` and one of ``counts[0]``
    cycles, so start-up and warm-up cancel out), or None when valgrind is not installed.
    A fixed hash seed makes the start-up of both runs the same to a few hundred
    instructions; Python's garbage collections fall where they fall."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        return None
    totals = []
    for n in counts:
        args = [dsn, str(n), str(orgs), "bare" if bare else "driver", "asyncio" if asynchronous else "threads"]
        proc = subprocess.run([valgrind, "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable,
                               "-m", "benchmarks.driver", *args, *(["prepared"] if prepare else [])],
                              capture_output=True, text=True, cwd=Path(__file__).resolve().parent.parent,
                              env={**os.environ, "PYTHONHASHSEED": "0"})  # fmt: skip
        found = _COLLECTED.search(proc.stderr)
        if proc.returncode != 0 or found is None:
            raise RuntimeError(f"callgrind run failed ({proc.returncode}): {' '.join(args[1:])}\n{proc.stderr[-2000:]}")
        totals.append(int(found.group(1)))
    return (totals[1] - totals[0]) / (counts[1] - counts[0])


@dataclass
class Exhaustion:
    """What 8 clients looping admit -> settle on one organization left when each was refused."""

    allowance: int
    estimate: int
    stripes: int
    cycles: int
    used: int
    held: int
    refusals: int
    errors: int
    seconds: float

    @property
    def overspend(self) -> int:
        return max(0, self.used - self.allowance)

    @property
    def fitted_but_refused(self) -> bool:
        """A request of ``estimate`` would still fit once everything settled."""
        return self.used + self.estimate <= self.allowance


def run_exhaustion(dsn: str, *, allowance: int, estimate: int, stripes: int, workers: int) -> Exhaustion:
    """An organization with ``stripes`` stripes and ``allowance`` credits; ``workers``
    threads each loop admit(estimate) -> settle(estimate) until they get LL001 (the last
    one to stop is refused with nothing else held, so the allowance really was used up)."""
    from llm_db import AllowanceExhausted

    org = uuid.uuid4()
    with psycopg.connect(dsn, autocommit=True) as conn:
        llm = Llm(conn)
        llm.upsert_organization(org, "bench exhaustion", allowance)
        llm.set_period_stripes(org, stripes)
    cycles = [0] * workers
    errors = [0] * workers
    ready = threading.Barrier(workers)

    def work(k: int) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            client = Llm(conn)
            ready.wait()
            while True:
                try:
                    inv = client.admit_id(org, estimate, "bench-model")
                except AllowanceExhausted:
                    return
                except Exception:  # counted and reported
                    errors[k] += 1
                    continue
                client.settle(org, inv, estimate, 1)
                cycles[k] += 1

    start = time.perf_counter()
    threads = [threading.Thread(target=work, args=(k,), daemon=True) for k in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - start
    with psycopg.connect(dsn, autocommit=True) as conn:
        used, held = conn.execute(
            "SELECT used_credits, held_credits FROM llm.periods WHERE organization_id = %s", [org]
        ).fetchone()
    return Exhaustion(allowance, estimate, stripes, sum(cycles), used, held, workers, sum(errors), seconds)


if __name__ == "__main__":  # what client_instructions runs under callgrind
    dsn_arg, n_arg, orgs_arg, who, flavour = sys.argv[1:6]
    cycles(dsn_arg, int(n_arg), bare=who == "bare", asynchronous=flavour == "asyncio",
           prepare=sys.argv[6:] == ["prepared"], orgs=int(orgs_arg))  # fmt: skip
