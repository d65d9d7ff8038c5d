"""What every benchmark scenario shares: sizes, result rows, the helpers that load,
check and time a database, CPU and wait sampling, and pgbench."""

from __future__ import annotations

import datetime as dt
import os
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

import llm_db
from benchmarks import cpu
from benchmarks import queries as q
from benchmarks.server import Target, find_pgbench

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = Path(__file__).resolve().parent / "scripts"
UTC = dt.UTC
# the budgets' target: the cycle under three budgets against the cycle (docs/benchmarks.md)
BUDGETS_TARGET = 0.85


# ---------------------------------------------------------------- sizes


@dataclass(frozen=True)
class Sizes:
    pgbench_seconds: int = 25
    driver_seconds: int = 20
    clients: int = 8
    pgbench_scale: int = 8
    cycle_orgs: int = 100
    budget_projects: int = 100  # project ids per organization in the budget cycles
    budget_keys: int = 50  # API key ids per organization in the spread budget cycle
    recovery_orgs: int = 500
    recovery_per_org: int = 200
    recovery_rounds: int = 3
    pass_orgs: int = 5000
    history_steps: tuple[int, ...] = (500_000, 1_000_000, 1_500_000, 2_000_000)
    history_small: int = 1_000_000  # the "1 M" point of the 2 M / 1 M ratio
    history_chunk: int = 500_000
    tasks_per_history_task: int = 10
    drift_tasks: int = 100_000
    drift_requests_per_task: int = 2
    busy_month: int = 1_000_000  # requests settled in the current period (the audit's worst month)
    pass_repeats: int = 7
    stripe_counts: tuple[int, ...] = (1, 2, 4, 8, 16)
    exhaustion_allowance: int = 1_000_050
    cpu_cycles: int = 3000
    warmup_seconds: int = 10
    settle_seconds: float = 5.0


FULL = Sizes()
QUICK = Sizes(
    pgbench_seconds=6,
    driver_seconds=5,
    recovery_orgs=50,
    recovery_rounds=2,
    pass_orgs=500,
    history_steps=(50_000, 100_000, 150_000, 200_000),
    history_small=100_000,
    drift_tasks=10_000,
    busy_month=100_000,
    pass_repeats=2,
    stripe_counts=(1, 8),
    exhaustion_allowance=100_050,
    cpu_cycles=1000,
    warmup_seconds=3,
    settle_seconds=1.0,
)


# ---------------------------------------------------------------- results


@dataclass
class Row:
    """One line of the table."""

    key: str
    scenario: str
    figure: float
    unit: str
    baseline: float | None
    baseline_label: str
    ratio: float | None
    target: str  # ">= 0.60", "<= 1.15", "report", or "exact" (the exhaustion row)
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def met(self) -> bool | None:
        if self.target == "exact":  # no overspend, no refusal of a request that fitted
            return self.detail["overspend"] == 0 and not self.detail["fitted_but_refused"]
        if self.ratio is None or self.target == "report":
            return None
        op, value = self.target.split()
        return self.ratio >= float(value) if op == ">=" else self.ratio <= float(value)


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def ratio(a: float, b: float | None) -> float | None:
    return a / b if b else None


# ---------------------------------------------------------------- helpers


def now() -> dt.datetime:
    return dt.datetime.now(UTC)


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def checkpoint(target: Target, name: str) -> None:
    with target.connect(name) as conn:
        conn.execute("VACUUM ANALYZE")
        conn.execute("CHECKPOINT")


def settle(target: Target, name: str, sizes: Sizes) -> None:
    """VACUUM ANALYZE and CHECKPOINT, then a pause, so each timed run starts alike."""
    checkpoint(target, name)
    time.sleep(sizes.settle_seconds)


def invariant_violations(target: Target, name: str) -> tuple[int, float]:
    """How many violations ``llm.check_invariants()`` reports (each one logged), and the
    seconds the check took."""
    with target.connect(name) as conn:
        seconds, rows = timed(lambda: conn.execute(q.INVARIANTS).fetchall())
    for row in rows:
        log(f"  INVARIANT VIOLATED in {name}: {row}")
    return len(rows), seconds


def new_llm_database(target: Target, name: str) -> str:
    dsn = target.create_database(name)
    llm_db.migrate(dsn)
    with target.connect(name) as conn:
        conn.execute(q.TASK_KIND)
    return dsn


class Profiler:
    """pg_stat_statements top statements, and the llm routines' times
    (pg_stat_user_functions, track_functions = all), per scenario, when --profile is on."""

    # the llm routines' cumulative counters; read at reset and again after the run, so
    # that nothing resets the database's table statistics (autovacuum reads them)
    ROUTINES = """SELECT funcname, calls, self_time, total_time FROM pg_stat_user_functions
                   WHERE schemaname = 'llm'"""

    def __init__(self, target: Target, enabled: bool) -> None:
        self.target, self.enabled = target, enabled
        self.routines_before: dict[str, tuple[int, float, float]] = {}

    def reset(self, name: str) -> None:
        if self.enabled:
            with self.target.connect(name) as conn:
                conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                conn.execute("SELECT pg_stat_statements_reset()")
                conn.execute("SELECT pg_stat_clear_snapshot()")
                self.routines_before = {r[0]: r[1:] for r in conn.execute(self.ROUTINES)}

    def functions(self, name: str, limit: int = 15) -> list[dict[str, Any]]:
        """The llm routines by self time since the last reset: calls, self and total ms
        (wall time in the routine, lock waits included; total with what it called)."""
        if not self.enabled:
            return []
        with self.target.connect(name) as conn:
            rows = []
            for routine, calls, self_ms, total_ms in conn.execute(self.ROUTINES):
                before = self.routines_before.get(routine, (0, 0.0, 0.0))
                if calls > before[0]:
                    rows.append({"routine": routine, "calls": calls - before[0],
                                 "self_ms": round(self_ms - before[1], 1), "total_ms": round(total_ms - before[2], 1)})
        return sorted(rows, key=lambda r: r["self_ms"], reverse=True)[:limit]

    def top(self, name: str, limit: int = 25) -> list[dict[str, Any]]:
        if not self.enabled:
            return []
        with self.target.connect(name) as conn, conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
            cur.execute(
                """SELECT calls, round(total_exec_time::numeric, 1)::float8 AS total_ms,
                          round(mean_exec_time::numeric, 4)::float8 AS mean_ms,
                          left(regexp_replace(query, '\\s+', ' ', 'g'), 160) AS query
                     FROM pg_stat_statements
                    WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
                    ORDER BY total_exec_time DESC LIMIT %s""",
                [limit],
            )
            return cur.fetchall()


# ---------------------------------------------------------------- pgbench

_TPS = re.compile(r"^tps = ([0-9.]+) \(without initial connection time\)", re.M)
_LAT = re.compile(r"^latency average = ([0-9.]+) ms", re.M)
_FAILED = re.compile(r"^number of failed transactions: (\d+)", re.M)
_PROCESSED = re.compile(r"^number of transactions actually processed: (\d+)", re.M)


class WaitSampler:
    """Samples what the benchmark's sessions wait on (pg_stat_activity) while a run goes on."""

    QUERY = """SELECT coalesce(wait_event_type || ':' || wait_event, 'CPU') AS wait, count(*)
                 FROM pg_stat_activity WHERE application_name = 'llmbench' AND state = 'active'
                GROUP BY 1"""

    def __init__(self, target: Target, name: str, interval: float = 0.05) -> None:
        self.target, self.name, self.interval = target, name, interval
        self.counts: Counter[str] = Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with self.target.connect(self.name) as conn:
            while not self._stop.wait(self.interval):
                for wait, n in conn.execute(self.QUERY):
                    self.counts[wait] += n

    def __enter__(self) -> WaitSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def shares(self) -> dict[str, float]:
        total = sum(self.counts.values()) or 1
        return {k: round(v / total, 3) for k, v in self.counts.most_common(8)}


def pgbench(target: Target, name: str, args: Sequence[str]) -> dict[str, Any]:
    cmd = [find_pgbench(), *args, *target.pgbench_args(name)]
    with target.connect(name) as conn:
        wal_start = conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
        writes_before = _table_writes(conn)
        backend = conn.info.backend_pid
        server_before, machine_before = cpu.server_cpu_seconds(backend), cpu.machine_jiffies()
    with WaitSampler(target, name) as sampler:
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PGAPPNAME": "llmbench"})
    if proc.returncode != 0 or not _TPS.search(proc.stdout):
        raise RuntimeError(f"pgbench failed ({proc.returncode}): {' '.join(args)}\n{proc.stderr}\n{proc.stdout}")
    with target.connect(name) as conn:
        # pgbench's sessions have exited (their counts are flushed, their CPU reaped)
        _wait_for_sessions_to_end(conn)
        server_after, machine_after = cpu.server_cpu_seconds(conn.info.backend_pid), cpu.machine_jiffies()
        wal_end = conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
        wal_bytes = conn.execute("SELECT %s::pg_lsn - %s::pg_lsn", [wal_end, wal_start]).fetchone()[0]
        writes_after = _table_writes(conn)
    failed = _FAILED.search(proc.stdout)
    processed = _PROCESSED.search(proc.stdout)
    runs = int(processed.group(1)) if processed else 0
    records = wal_records(target, str(wal_start), str(wal_end))
    return {
        "tps": float(_TPS.search(proc.stdout).group(1)),
        "latency_ms": float(_LAT.search(proc.stdout).group(1)) if _LAT.search(proc.stdout) else None,
        "failed": int(failed.group(1)) if failed else 0,
        "args": list(args),
        "session_states": sampler.shares(),  # share of sampled active sessions: CPU or a wait event
        # WAL written per script run (the whole server's, the run dominates it): a run whose
        # sessions wait on WALWrite is bounded by this
        "wal_bytes_per_run": round(float(wal_bytes) / int(processed.group(1))) if processed else None,
        # per script run, WAL records by kind (pg_waldump --stats=record; when the server's
        # WAL is on this machine): throughput.index_entries counts the index entries
        # written from them
        "wal_records_per_run": {kind: {k: round(v / runs, 2) for k, v in figures.items()}
                                for kind, figures in records.items()} if runs and records else None,
        # per script run: CPU of the whole server and of the machine (pgbench included),
        # and the machine's time busy, idle and stolen by its host over the run
        **_cpu_figures(server_before, server_after, machine_before, machine_after, runs),
        # per script run and table: rows inserted, updated, of which HOT (no index entry)
        "table_writes": {
            table: {k: round((v - writes_before.get(table, {}).get(k, 0)) / runs, 2) for k, v in counts.items()}
            for table, counts in writes_after.items() if runs
        },  # fmt: skip
    }


def _wait_for_sessions_to_end(conn: psycopg.Connection) -> None:
    """Until no pgbench session is left (their statistics flushed, their CPU reaped), 5 s at most."""
    for _ in range(100):
        if not conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'llmbench'"
                            " AND pid <> pg_backend_pid()").fetchone()[0]:  # fmt: skip
            return
        time.sleep(0.05)


def _cpu_figures(server_before: float | None, server_after: float | None, machine_before: dict[str, int] | None,
                 machine_after: dict[str, int] | None, runs: int) -> dict[str, Any]:  # fmt: skip
    """Server and machine CPU µs per script run, and the machine's shares of busy, idle and
    stolen time over the run; empty where /proc does not say (a remote server: no server
    figure)."""
    figures: dict[str, Any] = {}
    if server_before is not None and server_after is not None and runs:
        figures["server_cpu_us_per_run"] = round((server_after - server_before) / runs * 1e6, 1)
    if machine_before is not None and machine_after is not None and runs:
        spent = {k: machine_after[k] - machine_before[k] for k in machine_after}
        total = sum(spent.values()) or 1
        figures["machine_cpu_us_per_run"] = round(spent["busy"] / cpu.TICKS / runs * 1e6, 1)
        figures["machine_shares"] = {k: round(v / total, 3) for k, v in spent.items()}
    return figures


def _table_writes(conn: psycopg.Connection) -> dict[str, dict[str, int]]:
    """Rows inserted and updated (and updated HOT, which adds no index entry) per table written."""
    rows = conn.execute(
        """SELECT schemaname || '.' || relname, n_tup_ins, n_tup_upd, n_tup_hot_upd
             FROM pg_stat_user_tables WHERE n_tup_ins + n_tup_upd > 0"""
    ).fetchall()
    return {t: {"inserted": i, "updated": u, "hot": h} for t, i, u, h in rows}


def run_args(sizes: Sizes, *extra: str, seconds: int | None = None) -> list[str]:
    jobs = str(min(sizes.clients, os.cpu_count() or 1))
    duration = str(sizes.pgbench_seconds if seconds is None else seconds)
    return ["-c", str(sizes.clients), "-j", jobs, "-T", duration, "-M", "prepared", *extra]




def cpu_delta(pid: int, before: float | None) -> float | None:
    after = cpu.cpu_seconds(pid)
    return None if before is None or after is None else after - before


# ---------------------------------------------------------------- WAL records

PG_WALDUMP_CANDIDATES = ("/usr/lib/postgresql/15/bin/pg_waldump", "/usr/bin/pg_waldump")
_WALDUMP_STATS = re.compile(
    r"^(\S+/\S+)\s+(\d+)\s+\(\s*[\d.]+\)\s+(\d+)\s+\(\s*[\d.]+\)\s+(\d+)\s+\(\s*[\d.]+\)\s+(\d+)", re.M)


def wal_directory(target: Target) -> Path | None:
    """The server's pg_wal, when it is on this machine and readable; else None."""
    try:
        with target.connect() as conn:
            data = conn.execute("SELECT current_setting('data_directory')").fetchone()[0]
    except psycopg.Error:
        return None
    wal = Path(data) / "pg_wal"
    return wal if wal.is_dir() and os.access(wal, os.R_OK) else None


def wal_records(target: Target, start: str, end: str) -> dict[str, dict[str, int]]:
    """WAL records between two LSNs by kind (``Heap/HOT_UPDATE``, ``Btree/INSERT_LEAF``,
    ...): how many, their bytes and their full-page images' bytes, from ``pg_waldump
    --stats=record``; empty when the WAL is not on this machine."""
    wal, waldump = wal_directory(target), next((p for p in PG_WALDUMP_CANDIDATES if Path(p).exists()), None)
    if wal is None or waldump is None:
        return {}
    proc = subprocess.run([waldump, "-p", str(wal), "-s", start, "-e", end, "--stats=record"],
                          capture_output=True, text=True)  # fmt: skip
    return {m[1]: {"records": int(m[2]), "bytes": int(m[3]), "fpi_bytes": int(m[4])}
            for m in _WALDUMP_STATS.finditer(proc.stdout)}  # fmt: skip


def wal_listing(target: Target, start: str, end: str) -> list[str]:
    """Every WAL record between two LSNs as ``pg_waldump`` prints it, for one request's
    write shape (docs/benchmarks.md); empty when the WAL is not on this machine."""
    wal, waldump = wal_directory(target), next((p for p in PG_WALDUMP_CANDIDATES if Path(p).exists()), None)
    if wal is None or waldump is None:
        return []
    proc = subprocess.run([waldump, "-p", str(wal), "-s", start, "-e", end], capture_output=True, text=True)
    return [line for line in proc.stdout.splitlines() if line.strip()]
