"""Server CPU per request: what one backend burns for one cycle, from /proc.

Throughput on a small shared machine moves with whatever else runs on it;
the CPU time the serving backend spends per request hardly does. One session
runs the statements ``n`` times (after a warm-up) and reads its backend's
utime + stime from ``/proc/<pid>/stat`` before and after. Only possible when
the server runs on this machine (the ephemeral server does); otherwise None.
"""

from __future__ import annotations

import os
import random
import re
import uuid
from collections.abc import Callable
from pathlib import Path

import psycopg

from benchmarks.driver import exec_id, org_id

TICKS = os.sysconf("SC_CLK_TCK")
_VARIABLE = re.compile(r"(?<![:\w]):(\w+)")  # a pgbench variable, not a :: cast


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of process ``pid`` in seconds, or None when it is not on this machine."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def machine_jiffies() -> dict[str, int] | None:
    """The machine's CPU time since boot by kind, in clock ticks (/proc/stat): busy
    (user, nice, system, irq, softirq), idle (idle, iowait) and steal (taken by the
    host for other guests); None off Linux."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    except (OSError, ValueError):
        return None
    user, nice, system, idle, iowait, irq, softirq, steal = fields
    return {"busy": user + nice + system + irq + softirq, "idle": idle + iowait, "steal": steal}


def server_cpu_seconds(backend_pid: int) -> float | None:
    """CPU seconds of the whole server whose backend is ``backend_pid``: its postmaster's
    reaped children (ended sessions, autovacuum workers: cutime + cstime) and its live
    children (the background processes); None when the server is not on this machine."""
    try:
        postmaster = _parent(backend_pid)
        fields = Path(f"/proc/{postmaster}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, ValueError, IndexError):
        return None
    total = (int(fields[13]) + int(fields[14])) / TICKS  # cutime, cstime
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if _parent(int(entry.name)) == postmaster:
                    total += cpu_seconds(int(entry.name)) or 0.0  # ended since: in cutime next time
            except (OSError, ValueError, IndexError):
                continue  # ended while read
    return total


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def backend_cpu_per_call(dsn: str, step: Callable[[psycopg.Connection, random.Random], None],
                         *, n: int, warmup: int = 200) -> float | None:  # fmt: skip
    """Microseconds of backend CPU per ``step``, or None when the backend is not local."""
    rng = random.Random(7)
    with psycopg.connect(dsn, autocommit=True, prepare_threshold=0) as conn:
        pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        for _ in range(warmup):
            step(conn, rng)
        before = cpu_seconds(pid)
        if before is None:
            return None
        for _ in range(n):
            step(conn, rng)
        after = cpu_seconds(pid)
    return None if after is None else (after - before) / n * 1e6


def cycle_step(orgs: int) -> Callable[[psycopg.Connection, random.Random], None]:
    """The request cycle of scripts/cycle.sql: admit, then settle, two transactions."""

    def step(conn: psycopg.Connection, rng: random.Random) -> None:
        k = rng.randint(1, orgs)
        org, inv = org_id(k), uuid.uuid4()
        conn.execute(
            "SELECT i.id FROM llm.admit_invocation(%s::uuid, 100, 'bench-model', %s::uuid, %s::uuid) AS i",
            [org, exec_id(k, 0), inv],
        )
        conn.execute("SELECT llm.settle_invocation(%s::uuid, %s::uuid, 80, 3, 1200, 300)", [org, inv])

    return step


def budget_cycle_step(first: int, orgs: int, projects: int, keys: int) -> Callable[[psycopg.Connection, random.Random], None]:
    """The request cycle of scripts/budgets.sql: the same, naming a project and an API key."""

    def step(conn: psycopg.Connection, rng: random.Random) -> None:
        k = rng.randint(first, first + orgs - 1)
        org, inv = org_id(k), uuid.uuid4()
        conn.execute(
            "SELECT i.id FROM llm.admit_invocation(%s::uuid, 100, 'bench-model', %s::uuid, %s::uuid,"
            " p_project => %s, p_api_key => %s) AS i",
            [org, exec_id(k, 0), inv, f"project-{rng.randint(1, projects)}", f"key-{k}-{rng.randint(1, keys)}"],
        )
        conn.execute("SELECT llm.settle_invocation(%s::uuid, %s::uuid, 80, 3, 1200, 300)", [org, inv])

    return step


def simple_update_step(scale: int) -> Callable[[psycopg.Connection, random.Random], None]:
    """pgbench's built-in simple-update transaction."""

    def step(conn: psycopg.Connection, rng: random.Random) -> None:
        aid, bid, tid = rng.randint(1, 100_000 * scale), rng.randint(1, scale), rng.randint(1, 10 * scale)
        delta = rng.randint(-5000, 5000)
        with conn.transaction():
            conn.execute("UPDATE pgbench_accounts SET abalance = abalance + %s WHERE aid = %s", [delta, aid])
            conn.execute("SELECT abalance FROM pgbench_accounts WHERE aid = %s", [aid])
            conn.execute(
                "INSERT INTO pgbench_history (tid, bid, aid, delta, mtime)"
                " VALUES (%s, %s, %s, %s, CURRENT_TIMESTAMP)",
                [tid, bid, aid, delta],
            )

    return step


def script_step(path: Path, draw: Callable[[random.Random], dict[str, object]]) -> Callable[[psycopg.Connection, random.Random], None]:
    """The SQL commands of a pgbench script (scripts/floor.sql, …) run as psycopg
    statements: ``:name`` takes the value ``draw`` gives it (in place of the script's
    ``\\set`` lines), and a command ending in ``\\gset`` sets the variables its row names."""
    commands: list[tuple[str, bool]] = []
    lines: list[str] = []
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith(("--", "\\set")):
            continue
        gset = stripped.endswith("\\gset")
        lines.append(line.rstrip().removesuffix("\\gset"))
        if gset or stripped.endswith(";"):
            text = "\n".join(lines).replace("%", "%%")
            commands.append((_VARIABLE.sub(r"%(\1)s", text), gset))
            lines = []

    def step(conn: psycopg.Connection, rng: random.Random) -> None:
        values = draw(rng)
        for text, gset in commands:
            cur = conn.execute(text, values)
            if gset:
                row = cur.fetchone()
                assert row is not None and cur.description is not None, "a \\gset command returned no row"
                values |= {col.name: value for col, value in zip(cur.description, row, strict=True)}

    return step


