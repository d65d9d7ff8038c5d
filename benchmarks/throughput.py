"""The request-cycle scenarios: the SQL cycle against pgbench simple-update, the hot
organization and its stripes, the ceilings, CPU and WAL per request, exhaustion,
and the Python driver (benchmarks/README.md, "Scenarios")."""

from __future__ import annotations

import random
import re
import statistics
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchmarks import common, cpu, driver
from benchmarks import queries as q
from benchmarks.server import Target, find_pgbench


def bench_throughput(target: Target, sizes: common.Sizes, profiler: common.Profiler) -> tuple[list[common.Row], dict[str, Any]]:
    # Long on purpose: the order of its runs is part of the measurement (warm-up first,
    # the spread cycle before and after the hot ones, the WAL-heavy baseline last), so
    # it stays one script read top to bottom, each run logged as it goes.
    common.log(f"pgbench baseline database: init -s {sizes.pgbench_scale}")
    target.create_database("pgbench")
    _pgbench_init(target, sizes)

    # organizations 1 .. cycle_orgs run the plain cycle; as many more run it under budgets
    common.log(f"request-cycle database: {2 * sizes.cycle_orgs} organizations, one running task per client slot")
    load_request_database(target, sizes)
    violations_loaded, _ = common.invariant_violations(target, "cycle")

    # The baseline runs last: simple-update writes gigabytes of WAL in its run,
    # and the virtual disk's flushes stay slow for a while after such a burst.
    script = str(common.SCRIPTS / "cycle.sql")
    results: dict[str, Any] = {"invariants_after_load": violations_loaded}

    # Warm-up: a database whose invocations table was empty at its last ANALYZE
    # plans every lookup of it as a sequential scan, and PL/pgSQL keeps those
    # plans until the next ANALYZE invalidates them (autovacuum's, in a minute or
    # so; docs/upgrading.md). Measured from empty, 8 clients rescan a table that
    # grows all through the run (0.4x of the warm figure). A service measures
    # against history, so the cycle runs once, untimed, before settle() analyzes.
    common.log(f"warm-up: cycle.sql for {sizes.warmup_seconds} s, then VACUUM ANALYZE")
    results["warmup"] = common.pgbench(target, "cycle", common.run_args(sizes, "-n", "-f", script, "-D", f"norgs={sizes.cycle_orgs}",
                                                          seconds=sizes.warmup_seconds))
    common.log(f"  {results['warmup']['tps']:.0f} requests/s (untimed)")
    for key, orgs in (("cycle_spread", sizes.cycle_orgs), ("cycle_hot", 1)):
        common.settle(target, "cycle", sizes)
        profiler.reset("cycle")
        common.log(f"pgbench cycle.sql over {orgs} organization(s), {sizes.clients} clients")
        results[key] = common.pgbench(target, "cycle", common.run_args(sizes, "-n", "-f", script, "-D", f"norgs={orgs}"))
        results[key]["profile"] = profiler.top("cycle")
        results[key]["routines"] = profiler.functions("cycle")
        common.log(f"  {results[key]['tps']:.0f} requests/s")

    # one hot organization, its period spread over more stripes (stripes = 1 is cycle_hot)
    results["stripes"] = {1: results["cycle_hot"]["tps"]}
    for count in sizes.stripe_counts[1:]:
        with target.connect("cycle") as conn:
            conn.execute(q.SET_STRIPES, {"n": 1, "stripes": count})
        common.settle(target, "cycle", sizes)
        common.log(f"pgbench cycle.sql over 1 organization with {count} stripes, {sizes.clients} clients")
        run = common.pgbench(target, "cycle", common.run_args(sizes, "-n", "-f", script, "-D", "norgs=1"))
        results["stripes"][count] = run["tps"]
        if count == 8:
            results["cycle_hot_8"] = run
        common.log(f"  {run['tps']:.0f} requests/s")
    with target.connect("cycle") as conn:
        conn.execute(q.SET_STRIPES, {"n": 1, "stripes": 1})
    # the priced cycle: the same organizations, priced by the book; between
    # the spread runs too, whose mean it is compared with
    common.settle(target, "cycle", sizes)
    common.log(f"pgbench priced.sql over {sizes.cycle_orgs} organizations, {sizes.clients} clients")
    results["priced"] = common.pgbench(target, "cycle", common.run_args(
        sizes, "-n", "-f", str(common.SCRIPTS / "priced.sql"), "-D", f"norgs={sizes.cycle_orgs}"))  # fmt: skip
    common.log(f"  {results['priced']['tps']:.0f} requests/s")
    # The spread cycle once more: the hot runs (and the priced run) are compared with the
    # mean of the spread runs before and after them, as the disk's flush time drifts
    # over a run of minutes.
    common.settle(target, "cycle", sizes)
    common.log(f"pgbench cycle.sql over {sizes.cycle_orgs} organizations again, {sizes.clients} clients")
    results["cycle_spread_after"] = common.pgbench(target, "cycle", common.run_args(sizes, "-n", "-f", script,
                                                                      "-D", f"norgs={sizes.cycle_orgs}"))
    common.log(f"  {results['cycle_spread_after']['tps']:.0f} requests/s")
    # the floor: the same rows and reads as plain SQL, beside the cycle it bounds
    common.settle(target, "cycle", sizes)
    common.log(f"pgbench floor.sql over {sizes.cycle_orgs} organizations, {sizes.clients} clients")
    results["floor"] = common.pgbench(target, "cycle", common.run_args(
        sizes, "-n", "-f", str(common.SCRIPTS / "floor.sql"), "-D", f"norgs={sizes.cycle_orgs}"))  # fmt: skip
    common.log(f"  {results['floor']['tps']:.0f} requests/s")
    results |= _budget_runs(target, sizes, profiler)

    dsn = target.dsn("cycle")
    results |= _driver_runs(target, sizes, dsn)

    common.settle(target, "cycle", sizes)
    common.log(f"exhaustion: {sizes.clients} clients, admit(100) -> settle(100) on one organization with 8 stripes")
    exhausted = driver.run_exhaustion(dsn, allowance=sizes.exhaustion_allowance, estimate=100, stripes=8,
                                      workers=sizes.clients)  # fmt: skip
    results["exhaustion"] = asdict(exhausted) | {"overspend": exhausted.overspend,
                                                 "fitted_but_refused": exhausted.fitted_but_refused}  # fmt: skip
    common.log(f"  {exhausted.cycles:,} cycles in {exhausted.seconds:.1f} s; used {exhausted.used:,} of "
        f"{exhausted.allowance:,}, overspend {exhausted.overspend}, fitted but refused: "
        f"{exhausted.fitted_but_refused}, errors {exhausted.errors}")  # fmt: skip

    common.log("server CPU per request, one session")
    results["cpu_us_per_request"] = _cpu_per_request(target, sizes, dsn)
    cpu_cycle, cpu_simple = results["cpu_us_per_request"]["cycle"], results["cpu_us_per_request"]["simple_update"]

    results["write_shape"] = _write_shape(target, sizes)

    violations_after, _ = common.invariant_violations(target, "cycle")
    results["invariants_after_runs"] = violations_after

    common.settle(target, "pgbench", sizes)
    common.log(f"pgbench -b simple-update, {sizes.clients} clients, {sizes.pgbench_seconds} s")
    base = common.pgbench(target, "pgbench", common.run_args(sizes, "-b", "simple-update"))
    results["simple_update"] = base
    common.log(f"  {base['tps']:.0f} tps")

    # the ceilings of any two-commit cycle: spread over all accounts, and on one row
    script = str(common.SCRIPTS / "two_commits.sql")
    for key, rows_ in (("two_commits", 100_000 * sizes.pgbench_scale), ("two_commits_hot", 1)):
        common.settle(target, "pgbench", sizes)
        common.log(f"pgbench two_commits.sql over {rows_:,} row(s), {sizes.clients} clients")
        results[key] = common.pgbench(target, "pgbench", common.run_args(sizes, "-n", "-f", script, "-D", f"rows={rows_}"))
        common.log(f"  {results[key]['tps']:.0f} requests/s")

    simple, spread = base["tps"], results["cycle_spread"]["tps"]
    spread_mean = (spread + results["cycle_spread_after"]["tps"]) / 2
    results["spread_runs"] = [spread, results["cycle_spread_after"]["tps"]]
    rows = [
        common.Row("cycle_spread", f"request cycle, {sizes.cycle_orgs} orgs, {sizes.clients} clients (pgbench)",
            spread, "requests/s", simple, "pgbench simple-update", common.ratio(spread, simple), ">= 0.60",
            results["cycle_spread"]),
        common.Row("cycle_hot", f"request cycle, 1 org (1 stripe), {sizes.clients} clients (pgbench)",
            results["cycle_hot"]["tps"], "requests/s", simple, "pgbench simple-update",
            common.ratio(results["cycle_hot"]["tps"], simple), "report", results["cycle_hot"]),
        common.Row("cycle_hot_8", f"request cycle, 1 org with 8 stripes, {sizes.clients} clients (pgbench)",
            results["cycle_hot_8"]["tps"], "requests/s", simple, "pgbench simple-update",
            common.ratio(results["cycle_hot_8"]["tps"], simple), "report", results["cycle_hot_8"]),
        common.Row("cycle_hot_8_vs_spread", "the same, against the cycle over 100 orgs (mean of the runs before "
            "and after the hot runs)", results["cycle_hot_8"]["tps"], "requests/s", spread_mean,
            "request cycle, 100 orgs", common.ratio(results["cycle_hot_8"]["tps"], spread_mean), ">= 0.90",
            {"stripes": results["stripes"], "spread_runs": results["spread_runs"]}),
        common.Row("exhaustion", f"exhaustion: {sizes.clients} clients on 1 org with 8 stripes until refused "
            "(used credits; overspend and fitted-but-refused must be 0)",
            exhausted.used, "credits", exhausted.allowance, "its allowance",
            common.ratio(exhausted.used, exhausted.allowance), "exact", results["exhaustion"]),
        common.Row("two_commits", "ceiling of any two-commit cycle: two one-row UPDATE transactions (pgbench)",
            results["two_commits"]["tps"], "requests/s", simple, "pgbench simple-update",
            common.ratio(results["two_commits"]["tps"], simple), "report", results["two_commits"]),
        common.Row("two_commits_hot", "the same ceiling, every transaction on one row (pgbench)",
            results["two_commits_hot"]["tps"], "requests/s", simple, "pgbench simple-update",
            common.ratio(results["two_commits_hot"]["tps"], simple), "report", results["two_commits_hot"]),
    ]  # fmt: skip
    if cpu_cycle and cpu_simple:
        rows.append(common.Row("cpu_per_request", "server CPU per request, one session (admit + settle)", cpu_cycle,
                        "us", cpu_simple, "simple-update transaction", common.ratio(cpu_simple, cpu_cycle), ">= 0.50",
                        results["cpu_us_per_request"]))  # fmt: skip
    rows += _floor_rows(results, spread_mean, simple)
    rows += _budget_rows(results, sizes, spread_mean, base)
    rows += _cpu_rows(results["cpu_us_per_request"])
    rows += _priced_rows(results, spread_mean, cpu_cycle)
    rows += _driver_rows(results, sizes, spread)
    return rows, results


# The steps whose server CPU the proof of the budgets' target compares (docs/benchmarks.md
# "Why the two targets are short") run in this many interleaved rounds; each figure is
# the median of its rounds.
CPU_ROUNDS = 3


@contextmanager
def around_run(target: Target, name: str) -> Iterator[None]:
    """The state a run of ``name`` needs, for the run: for ``budgets_off_row``, the
    budgets of the organizations taken off their rows (q.UNIFORM_BUDGETS_OFF) and put
    back after it; nothing for the others."""
    if name != "budgets_off_row":
        yield
        return
    with target.connect("cycle") as conn:
        conn.execute(q.UNIFORM_BUDGETS_OFF)
    try:
        yield
    finally:
        with target.connect("cycle") as conn:
            conn.execute(q.UNIFORM_BUDGETS_ON)


def _cpu_per_request(target: Target, sizes: common.Sizes, dsn: str) -> dict[str, Any]:
    """Server CPU per request, one session: the cycle, its floor, and both under three
    budgets in CPU_ROUNDS interleaved rounds (medians, and the rounds under "rounds");
    simple-update and the priced cycle once. None where the server is not local."""
    first = sizes.cycle_orgs + 1

    def spread(rng: random.Random) -> dict[str, object]:
        return {"n": rng.randint(first, first + sizes.cycle_orgs - 1), "slot": 0,
                "p": rng.randint(1, sizes.budget_projects), "k": rng.randint(1, sizes.budget_keys)}  # fmt: skip

    steps = {
        "cycle": cpu.cycle_step(sizes.cycle_orgs),
        "budgets": cpu.budget_cycle_step(first, sizes.cycle_orgs, sizes.budget_projects, sizes.budget_keys),
        "floor": cpu.script_step(common.SCRIPTS / "floor.sql",
                                 lambda rng: {"n": rng.randint(1, sizes.cycle_orgs), "slot": 0}),
        "floor_budgets": cpu.script_step(common.SCRIPTS / "floor_budgets.sql", spread),
    }  # fmt: skip
    # and under three budgets read from llm.budget_limits, as before 0.4.0's migration
    # 0029: what their organizations' rows save (q.UNIFORM_BUDGETS_OFF)
    steps["budgets_off_row"] = steps["budgets"]
    rounds: dict[str, list[float | None]] = {name: [] for name in steps}
    for _ in range(CPU_ROUNDS):
        for name, step in steps.items():
            with around_run(target, name):
                rounds[name].append(cpu.backend_cpu_per_call(dsn, step, n=sizes.cpu_cycles))
    figures: dict[str, Any] = {
        name: None if None in runs else statistics.median(runs)
        for name, runs in rounds.items()
    }
    figures["simple_update"] = cpu.backend_cpu_per_call(
        target.dsn("pgbench"), cpu.simple_update_step(sizes.pgbench_scale), n=2 * sizes.cpu_cycles)
    figures["priced"] = cpu.backend_cpu_per_call(dsn, cpu.script_step(common.SCRIPTS / "priced.sql", lambda rng: {
        "n": rng.randint(1, sizes.cycle_orgs), "slot": 0, "inp": rng.randint(800, 1600)}), n=sizes.cpu_cycles)
    figures["rounds"] = rounds
    common.log("  " + ", ".join(f"{name} {figures[name]:.0f} us" for name in (*steps, "simple_update", "priced")
                                if figures[name] is not None))
    return figures  # fmt: skip


def _cpu_rows(cpu_us: dict[str, Any]) -> list[common.Row]:
    """The CPU rows beside the cycle's: under three budgets, the floors, and what three
    budgets add at their floor against what the budgets' target leaves them."""
    cycle, budgets = cpu_us["cycle"], cpu_us["budgets"]
    floor, floor_budgets = cpu_us["floor"], cpu_us["floor_budgets"]
    if not (cycle and budgets and floor and floor_budgets):
        return []
    # At 0.85 of the cycle's throughput, a server-bound request under three budgets may
    # burn at most cycle / 0.85 of CPU: the target leaves the budgets cycle * (1/0.85 - 1).
    # Their rows and read alone, as plain SQL, burn floor_budgets - floor: more than
    # that is more than any code that keeps those rows can spend (ratio below 1).
    leaves = cycle * (1 / common.BUDGETS_TARGET - 1)
    added = floor_budgets - floor
    off_row = cpu_us.get("budgets_off_row")
    return [
        common.Row("cpu_budgets", "server CPU per request under 3 budgets, one session (admit + settle)",
                   budgets, "us", cycle, "the cycle without budgets", common.ratio(cycle, budgets), "report", cpu_us),
        *([common.Row("cpu_budgets_off_row", "the same, the budgets read from llm.budget_limits, not from their "
                      "organizations' rows (as before migration 0029; ratio: from the rows / read)", off_row, "us",
                      budgets, "the budgets on their organizations' rows", common.ratio(budgets, off_row), "report",
                      cpu_us)] if off_row else []),
        common.Row("cpu_floor", "server CPU per request, one session: the floor (floor.sql)", floor,
                   "us", cycle, "the cycle", common.ratio(floor, cycle), "report", cpu_us),
        common.Row("cpu_floor_budgets", "server CPU per request, one session: the floor under 3 budgets "
                   "(floor_budgets.sql)", floor_budgets, "us", budgets, "the cycle under 3 budgets",
                   common.ratio(floor_budgets, budgets), "report", cpu_us),
        common.Row("cpu_budgets_floor_added", "server CPU 3 budgets add at their floor (floor_budgets.sql "
                   "- floor.sql), against what the target 0.85 leaves them (the cycle's CPU x (1/0.85 - 1)); "
                   f"medians of {CPU_ROUNDS} interleaved rounds", added, "us", leaves,
                   "left by the target", common.ratio(leaves, added), "report", cpu_us),
    ]  # fmt: skip


def _write_shape(target: Target, sizes: common.Sizes) -> dict[str, list[str]]:
    """What one request writes, as pg_waldump lists it: one cycle without budgets, and one
    under three budgets, each admitted and settled by one session on a quiet server
    (docs/benchmarks.md prints them)."""
    shapes: dict[str, list[str]] = {}
    first = sizes.cycle_orgs + 1
    cycles = {
        "cycle": cpu.cycle_step(1),
        "budgets": cpu.budget_cycle_step(first, 1, 1, 1),
    }
    with target.connect("cycle") as conn:
        names = dict(conn.execute("SELECT c.relfilenode::text, c.relname::text FROM pg_class AS c"
                                  " WHERE c.relfilenode <> 0").fetchall())  # fmt: skip
        for name, step in cycles.items():
            step(conn, random.Random(1))  # plans and pages warm: no full-page image below
            start = conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
            step(conn, random.Random(2))
            end = conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
            shapes[name] = [re.sub(r"rel (\d+)/(\d+)/(\d+)", lambda m: f"rel {names.get(m[3], m[3])}", line)
                            for line in common.wal_listing(target, str(start), str(end))]  # fmt: skip
    return shapes


# The driver against bare psycopg sending the same two statements at the same prepare
# setting, sync and asyncio. A rate on this VM moves by 10 % between
# runs of 10 s, so each flavour runs DRIVER_BLOCKS blocks of four short runs, driver,
# bare, bare, driver and then bare, driver, driver, bare (each side first in half of
# them, after the CHECKPOINT that starts a block), each side driver_seconds in all. The
# ratio is the median of the blocks' ratios, as the passes' is of their pairs'.
DRIVER_FLAVOURS = {
    "threads": (driver.run_threads, False),
    "threads_prepared": (driver.run_threads, True),
    "asyncio": (driver.run_asyncio, False),
    "asyncio_prepared": (driver.run_asyncio, True),
}
DRIVER_BLOCKS = 4


def _driver_runs(target: Target, sizes: common.Sizes, dsn: str) -> dict[str, Any]:
    results: dict[str, Any] = {}
    seconds = sizes.driver_seconds / (2 * DRIVER_BLOCKS)
    for flavour, (fn, prepare) in DRIVER_FLAVOURS.items():
        runs: dict[str, list[Any]] = {"driver": [], "bare": []}
        block_ratios = []
        common.log(f"Python driver and bare psycopg, {flavour}, {sizes.clients} workers: "
                   f"{DRIVER_BLOCKS} blocks of 4 runs of {seconds} s")  # fmt: skip
        for block in range(DRIVER_BLOCKS):
            common.settle(target, "cycle", sizes)
            order = ("driver", "bare", "bare", "driver") if block % 2 == 0 else ("bare", "driver", "driver", "bare")
            done: dict[str, list[Any]] = {"driver": [], "bare": []}
            for who in order:
                run = fn(dsn, workers=sizes.clients, seconds=seconds, orgs=sizes.cycle_orgs,
                         bare=who == "bare", prepare=prepare)  # fmt: skip
                done[who].append(run)
                runs[who].append(run)
            rates = {who: _pooled(done[who])["rate"] for who in done}
            block_ratios.append(rates["driver"] / rates["bare"])
            common.log(f"  block {block + 1}: driver {rates['driver']:.0f}, bare {rates['bare']:.0f} requests/s "
                       f"({block_ratios[-1]:.3f}; {sum(r.errors for r in done['driver'] + done['bare'])} errors)")  # fmt: skip
        for who, key in (("driver", f"driver_{flavour}"), ("bare", f"bare_{flavour}")):
            via = "psycopg alone, the driver's two statements" if who == "bare" else driver.VIA
            results[key] = _pooled(runs[who]) | {"runs": [asdict(r) for r in runs[who]], "via": via}
        results[f"driver_{flavour}"] |= {"block_ratios": block_ratios, "ratio": statistics.median(block_ratios)}
        common.log(f"  median of the blocks' ratios {statistics.median(block_ratios):.3f} "
                   f"({min(block_ratios):.3f}-{max(block_ratios):.3f})")  # fmt: skip
    # what the client executes per cycle, one connection at a time: the figure the VM's
    # noise does not move (benchmarks/driver.py); both prepare settings ask the same of it
    for flavour in ("threads", "asyncio"):
        counted = {who: driver.client_instructions(dsn, bare=who == "bare", asynchronous=flavour == "asyncio",
                                                   prepare=False, orgs=sizes.cycle_orgs)
                   for who in ("driver", "bare")}  # fmt: skip
        results[f"instructions_{flavour}"] = counted
        if counted["driver"] and counted["bare"]:
            common.log(f"client instructions per request, {flavour}: driver {counted['driver']:,.0f}, "
                       f"bare {counted['bare']:,.0f}")  # fmt: skip
    return results


def _pooled(runs: list[driver.DriverRun]) -> dict[str, Any]:
    """Runs of one side taken together: requests over seconds, client CPU over requests."""
    requests, seconds = sum(r.requests for r in runs), sum(r.seconds for r in runs)
    cpu = sum(r.cpu_seconds for r in runs)
    return {"rate": requests / seconds, "requests": requests, "seconds": seconds,
            "errors": sum(r.errors for r in runs),
            "client_cpu_us_per_request": cpu / requests * 1e6 if requests else None}  # fmt: skip


def _driver_rows(results: dict[str, Any], sizes: common.Sizes, spread: float) -> list[common.Row]:
    rows = []
    labels = {
        "threads": f"{sizes.clients} threads, nothing prepared (the default)",
        "threads_prepared": f"{sizes.clients} threads, prepare=True (direct or session pooling only)",
        "asyncio": f"asyncio, {sizes.clients} tasks, nothing prepared",
        "asyncio_prepared": f"asyncio, {sizes.clients} tasks, prepare=True",
    }
    for flavour, label in labels.items():
        ours, bare = results[f"driver_{flavour}"], results[f"bare_{flavour}"]
        detail = ours | {"bare": {k: v for k, v in bare.items() if k != "runs"}}
        rows.append(common.Row(f"driver_{flavour}", f"request cycle via the Python driver, {label} "
                        f"(ratio: median of {DRIVER_BLOCKS} interleaved blocks)", ours["rate"], "requests/s",
                        bare["rate"], "bare psycopg, the same statements and prepare setting", ours["ratio"],
                        ">= 0.95", detail))  # fmt: skip
    for flavour in ("threads", "asyncio"):
        counted = results[f"instructions_{flavour}"]
        if counted["driver"] and counted["bare"]:
            rows.append(common.Row(f"driver_instructions_{flavour}", f"client instructions per request, "
                            f"{flavour}, one connection (callgrind; ratio: bare / driver)", counted["driver"],
                            "instructions", counted["bare"], "bare psycopg, the same statements",
                            common.ratio(counted["bare"], counted["driver"]), "report", counted))  # fmt: skip
    for flavour in ("threads", "asyncio"):
        ours = results[f"driver_{flavour}"]
        rows.append(common.Row(f"driver_{flavour}_vs_sql", f"the same ({flavour}, nothing prepared), against "
                        "the SQL-level cycle", ours["rate"], "requests/s", spread, "SQL-level cycle (pgbench)",
                        common.ratio(ours["rate"], spread), "report", ours))  # fmt: skip
    return rows


def load_request_database(target: Target, sizes: common.Sizes) -> None:
    """The database "cycle": organizations 1 .. cycle_orgs for the plain cycle and as
    many more under budgets (a project's month and an API key's day, '*'), one
    running task per client slot each, and the book's prices."""
    common.new_llm_database(target, "cycle")
    with target.connect("cycle") as conn:
        conn.execute(q.UPSERT_ORGS, {"orgs": 2 * sizes.cycle_orgs, "allowance": 10**12})
        conn.execute(q.OPEN_TASKS, {"orgs": 2 * sizes.cycle_orgs, "slots": sizes.clients, "started_at": common.now()})
        conn.execute(q.SET_BUDGETS, {"first": sizes.cycle_orgs + 1, "orgs": sizes.cycle_orgs, "limit": 10**12})
        conn.execute(q.SET_PRICES)


def prefill_counters(target: Target, sizes: common.Sizes) -> None:
    """One request per project and key of the organizations under budgets, so every
    counter a timed run moves exists already (queries.PREFILL_COUNTERS)."""
    first = sizes.cycle_orgs + 1
    with target.connect("cycle") as conn:
        # one transaction per organization: in one for all, every admission would walk
        # the ever longer chain of row versions its own transaction left on each row
        for n in range(first, first + sizes.cycle_orgs):
            conn.execute(q.PREFILL_COUNTERS, {"first": n, "orgs": 1, "projects": sizes.budget_projects,
                                              "keys": sizes.budget_keys})  # fmt: skip


def _budget_runs(target: Target, sizes: common.Sizes, profiler: common.Profiler) -> dict[str, Any]:
    """The cycle under three budgets: keys spread over many ids, then every
    client on one key's day in an organization with 8 stripes, then spread again (the
    hot run is compared with the mean of the two spread runs around it)."""
    script, first = str(common.SCRIPTS / "budgets.sql"), sizes.cycle_orgs + 1
    spread = ["-D", f"first={first}", "-D", f"norgs={sizes.cycle_orgs}",
              "-D", f"nprojects={sizes.budget_projects}", "-D", f"nkeys={sizes.budget_keys}"]  # fmt: skip
    hot = ["-D", f"first={first}", "-D", "norgs=1", "-D", f"nprojects={sizes.budget_projects}", "-D", "nkeys=1"]
    results: dict[str, Any] = {}
    common.log(f"budget counters: one request per project and key of {sizes.cycle_orgs} organizations")
    prefill_counters(target, sizes)
    # warm-up, as for the plain cycle: the counters' plans
    common.log(f"warm-up: budgets.sql for {sizes.warmup_seconds} s")
    results["budgets_warmup"] = common.pgbench(target, "cycle", common.run_args(
        sizes, "-n", "-f", script, *spread, seconds=sizes.warmup_seconds))  # fmt: skip
    for key, args in (("budgets_spread", spread), ("budgets_hot_key", hot), ("budgets_spread_after", spread)):
        # the hot key: its organization's period and its keys' day budget on 8 stripes
        stripes = 8 if key == "budgets_hot_key" else 1
        with target.connect("cycle") as conn:
            conn.execute(q.SET_STRIPES, {"n": first, "stripes": stripes})
            conn.execute(q.SET_KEY_STRIPES, {"n": first, "stripes": stripes})
        common.settle(target, "cycle", sizes)
        profiler.reset("cycle")
        common.log(f"pgbench budgets.sql ({key}), {sizes.clients} clients")
        results[key] = common.pgbench(target, "cycle", common.run_args(sizes, "-n", "-f", script, *args))
        results[key]["profile"] = profiler.top("cycle")
        results[key]["routines"] = profiler.functions("cycle")
        common.log(f"  {results[key]['tps']:.0f} requests/s, {results[key]['wal_bytes_per_run']} WAL bytes each")
    common.settle(target, "cycle", sizes)
    common.log(f"pgbench floor_budgets.sql, keys spread, {sizes.clients} clients")
    results["floor_budgets"] = common.pgbench(target, "cycle", common.run_args(
        sizes, "-n", "-f", str(common.SCRIPTS / "floor_budgets.sql"), *spread))  # fmt: skip
    common.log(f"  {results['floor_budgets']['tps']:.0f} requests/s")
    # the package's cycle, then the same plus the counters' writes alone, then plus
    # their read too (the budgets' floor on the cycle: docs/benchmarks.md "Why the two
    # targets are short"), side by side
    from benchmarks import floors  # it imports this module

    with tempfile.TemporaryDirectory(prefix="llmbench-") as variants:
        scripts = (("budget_floor_cycle", str(common.SCRIPTS / "cycle.sql")),
                   ("cycle_budget_rows", str(common.SCRIPTS / "cycle_budget_rows.sql")),
                   ("cycle_budget_floor", str(floors.write_cycle_budget_floor(Path(variants)))))  # fmt: skip
        for key, path in scripts:
            common.settle(target, "cycle", sizes)
            common.log(f"pgbench {Path(path).name} ({key}), {sizes.clients} clients")
            results[key] = common.pgbench(target, "cycle", common.run_args(
                sizes, "-n", "-f", path, "-D", f"norgs={sizes.cycle_orgs}", "-D", f"nprojects={sizes.budget_projects}",
                "-D", f"nkeys={sizes.budget_keys}", "-D", f"offset={sizes.cycle_orgs}"))  # fmt: skip
            common.log(f"  {results[key]['tps']:.0f} requests/s")
    return results


def _budget_rows(results: dict[str, Any], sizes: common.Sizes, spread_mean: float,
                 base: dict[str, Any]) -> list[common.Row]:  # fmt: skip
    """The three budget targets of docs/benchmarks.md's table, and WAL per request of each cycle."""
    budgets = (results["budgets_spread"]["tps"] + results["budgets_spread_after"]["tps"]) / 2
    hot = results["budgets_hot_key"]["tps"]
    runs = {"budgets_runs": [results["budgets_spread"]["tps"], results["budgets_spread_after"]["tps"]],
            "spread_runs": results["spread_runs"]}  # fmt: skip
    rows = [
        common.Row("budgets_spread", f"request cycle under 3 budgets (allowance, project month, key day; "
            f"{sizes.cycle_orgs * sizes.budget_keys:,} keys), {sizes.cycle_orgs} orgs, {sizes.clients} clients "
            "(pgbench; mean of the runs before and after the hot key)", budgets, "requests/s", spread_mean,
            "request cycle, no budgets (mean)", common.ratio(budgets, spread_mean), f">= {common.BUDGETS_TARGET}", runs),
        common.Row("budgets_hot_key", f"the same, all {sizes.clients} clients on one key's day budget, "
            "its counter and its organization's period on 8 stripes (pgbench)", hot, "requests/s", budgets,
            "3 budgets, keys spread (mean)", common.ratio(hot, budgets), ">= 0.80", results["budgets_hot_key"]),
    ]  # fmt: skip
    wal_simple = base["wal_bytes_per_run"]
    shapes = (("", "cycle_spread", f"no budgets, {sizes.cycle_orgs} orgs"),
              ("_hot", "cycle_hot_8", "no budgets, 1 org with 8 stripes"),
              ("_budgets_spread", "budgets_spread", "3 budgets, keys spread (the first run)"),
              ("_budgets_hot_key", "budgets_hot_key", "3 budgets, one hot key"))  # fmt: skip
    for suffix, key, label in shapes:
        wal = results[key]["wal_bytes_per_run"]
        if wal and wal_simple:
            rows.append(common.Row(f"wal_per_request{suffix}", f"WAL per request, {label}", wal, "bytes",
                            wal_simple, "simple-update transaction", common.ratio(wal_simple, wal), "report",
                            {"cycle": wal, "simple_update": wal_simple}))  # fmt: skip
    simple_records = base.get("wal_records_per_run") or {}
    for suffix, key, label in shapes:
        records = results[key].get("wal_records_per_run") or {}
        if records:
            entries, base_entries = index_entries(records), index_entries(simple_records)
            rows.append(common.Row(f"index_entries{suffix}", f"index entries per request, {label} (pg_waldump)",
                            entries, "entries", base_entries, "simple-update transaction", None, "report",
                            {"records": records, "simple_update": simple_records}))  # fmt: skip
    return rows


# The WAL records that add an entry to a B-tree leaf: a plain insert, an insert into a
# posting list (a key already there, deduplicated), or a split of a full page, whose
# record carries the new entry (the rare split of an inner page counts too).
INDEX_ENTRY_RECORDS = ("Btree/INSERT_LEAF", "Btree/INSERT_POST", "Btree/SPLIT_L", "Btree/SPLIT_R")


def index_entries(records: dict[str, Any]) -> float | None:
    """Index entries per script run, from its WAL records by kind; None without them."""
    if not records:
        return None
    return round(sum(records.get(kind, {}).get("records", 0) for kind in INDEX_ENTRY_RECORDS), 2)


def _floor_rows(results: dict[str, Any], spread_mean: float, simple: float) -> list[common.Row]:
    """The floors (scripts/floor.sql, floor_budgets.sql): the rows and reads the books
    keep for a request, as plain SQL with no check, run on the same database. A cycle
    target above its floor's ratio is out of reach for any code that keeps these rows."""
    floor, floor_budgets = results["floor"]["tps"], results["floor_budgets"]["tps"]
    budgets = (results["budgets_spread"]["tps"] + results["budgets_spread_after"]["tps"]) / 2
    return [
        common.Row("floor", "floor: the cycle's rows and reads as two plain SQL statements, no checks (pgbench)",
            floor, "requests/s", simple, "pgbench simple-update", common.ratio(floor, simple), "report",
            results["floor"]),
        common.Row("cycle_vs_floor", "request cycle, 100 orgs (mean), against its floor", spread_mean, "requests/s",
            floor, "floor", common.ratio(spread_mean, floor), "report", {"spread_runs": results["spread_runs"]}),
        common.Row("floor_budgets", "floor under 3 budgets: the budgets' read and counters added (pgbench)",
            floor_budgets, "requests/s", floor, "floor", common.ratio(floor_budgets, floor), "report",
            results["floor_budgets"]),
        common.Row("budgets_vs_floor", "request cycle under 3 budgets (mean), against its floor", budgets,
            "requests/s", floor_budgets, "floor under 3 budgets", common.ratio(budgets, floor_budgets), "report",
            {"budgets_runs": [results["budgets_spread"]["tps"], results["budgets_spread_after"]["tps"]]}),
    ] + _budget_floor_rows(results, budgets)  # fmt: skip


def _budget_floor_rows(results: dict[str, Any], budgets: float) -> list[common.Row]:
    """The budgets' floor on the package's cycle: the cycle plus the counters' writes
    alone, then plus the budgets' read, both with no check, against the cycle run just
    before them; and the cycle under three budgets against that floor."""
    cycle = results["budget_floor_cycle"]["tps"]
    writes, floor = results["cycle_budget_rows"]["tps"], results["cycle_budget_floor"]["tps"]
    return [
        common.Row("cycle_budget_rows", "the cycle plus only the 3 budgets' counter writes, no read, no check "
            "(cycle_budget_rows.sql, pgbench)", writes, "requests/s", cycle, "request cycle, the run before",
            common.ratio(writes, cycle), "report", results["cycle_budget_rows"]),
        common.Row("cycle_budget_floor", "the cycle plus the 3 budgets' floor: their read and counter writes, no "
            "check (cycle_budget_floor, pgbench)", floor, "requests/s", cycle, "request cycle, the run before",
            common.ratio(floor, cycle), "report", results["cycle_budget_floor"]),
        common.Row("budgets_vs_budget_floor", "request cycle under 3 budgets (mean), against the cycle plus their "
            "floor", budgets, "requests/s", floor, "the cycle plus the budgets' floor",
            common.ratio(budgets, floor), "report", {}),
    ]  # fmt: skip


def _priced_rows(results: dict[str, Any], spread_mean: float, cpu_cycle: float | None) -> list[common.Row]:
    """The priced cycle (scripts/priced.sql): admitted from token counts and
    settled from usage, both priced by the book, against the unpriced cycle of the same
    run (the mean of its spread runs)."""
    priced = results["priced"]["tps"]
    rows = [common.Row("priced", "priced request cycle, 100 orgs: estimate from tokens, settle_usage (pgbench)",
                       priced, "requests/s", spread_mean, "request cycle, unpriced (mean)",
                       common.ratio(priced, spread_mean), ">= 0.90", results["priced"])]  # fmt: skip
    cpu_priced = results["cpu_us_per_request"]["priced"]
    if cpu_cycle and cpu_priced:
        rows.append(common.Row("cpu_priced", "server CPU per request, one session: the priced cycle (priced.sql)",
                               cpu_priced, "us", cpu_cycle, "the cycle", common.ratio(cpu_cycle, cpu_priced), "report",
                               results["cpu_us_per_request"]))  # fmt: skip
    return rows


def _pgbench_init(target: Target, sizes: common.Sizes) -> None:
    cmd = [find_pgbench(), "-i", "-s", str(sizes.pgbench_scale), "-q", *target.pgbench_args("pgbench")]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"pgbench -i failed: {proc.stderr}")
