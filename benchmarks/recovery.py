"""The recovery scenario: the pass recovering stranded requests against a bare UPDATE
of the same rows (benchmarks/README.md, "Scenarios")."""

from __future__ import annotations

import time
from typing import Any

import psycopg

from benchmarks import common, cpu
from benchmarks import queries as q
from benchmarks.server import Target


def bench_recovery(target: Target, sizes: common.Sizes, profiler: common.Profiler) -> tuple[list[common.Row], dict[str, Any]]:
    # Long on purpose: one load, then rounds alternating the bare UPDATE and the passes
    # on fresh copies of it; the comparison needs both sides of each round in one place.
    total = sizes.recovery_orgs * sizes.recovery_per_org
    common.log(f"recovery: loading {total:,} stranded requests over {sizes.recovery_orgs} organizations")
    common.new_llm_database(target, "recovery")
    clock = common.now()
    params = {"orgs": sizes.recovery_orgs, "per_org": sizes.recovery_per_org, "now": clock}
    load_start = time.perf_counter()
    with target.connect("recovery", autocommit=False) as conn:
        for stmt in (q.STRANDED_ORGS, q.STRANDED_TASKS, q.STRANDED_STAGE, q.STRANDED_PERIODS,
                     q.STRANDED_INVOCATIONS):  # fmt: skip
            conn.execute(stmt, params)
        conn.commit()
    load_seconds = time.perf_counter() - load_start
    common.checkpoint(target, "recovery")
    violations_loaded, _ = common.invariant_violations(target, "recovery")

    # Rounds on fresh file copies of the loaded database, the bare UPDATE and the
    # passes alternating, best of each: one pair of runs on this machine moved the
    # ratio between 0.20 and 0.38 (noisy neighbours), the best of three far less.
    rounds: list[dict[str, Any]] = []
    passes: list[dict[str, Any]] = []
    for r in range(sizes.recovery_rounds):
        common.log(f"recovery round {r + 1}/{sizes.recovery_rounds}: one bare UPDATE on a copy of the database")
        target.create_database("recovery_bare", template="recovery")
        common.settle(target, "recovery_bare", sizes)
        with target.connect("recovery_bare", autocommit=False) as conn:
            conn.execute("SELECT count(*) FROM llm.invocations").fetchone()  # same cache state as below
            conn.commit()
            pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
            conn.commit()
            bare_cpu = cpu.cpu_seconds(pid)
            bare_start = time.perf_counter()
            updated = conn.execute(q.BARE_RECOVERY_UPDATE, {"now": clock}).rowcount
            conn.commit()
            bare_seconds = time.perf_counter() - bare_start
            bare_cpu = common.cpu_delta(pid, bare_cpu)
        target.drop_database("recovery_bare")
        common.log(f"  {updated:,} rows in {bare_seconds:.2f} s = {updated / bare_seconds:,.0f} rows/s")

        common.log("  passes until nothing is stranded, on another copy")
        target.create_database("recovery_run", template="recovery")
        common.settle(target, "recovery_run", sizes)
        profiler.reset("recovery_run")
        passes = []
        with target.connect("recovery_run") as conn, conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
            conn.execute("SELECT count(*) FROM llm.invocations").fetchone()
            pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
            left = total
            while left and len(passes) < 50:
                pass_cpu = cpu.cpu_seconds(pid)
                seconds, _ = common.timed(lambda: cur.execute(q.RUN_PASS, {"now": clock}))
                pass_cpu = common.cpu_delta(pid, pass_cpu)
                cur.execute(q.LAST_RUN)
                run = cur.fetchone()
                left = cur.execute(q.STRANDED_LEFT, {"now": clock}).fetchone()["count"]
                passes.append({"seconds": seconds, "cpu": pass_cpu, "recovered": run["requests_recovered"],
                               "abandoned": run["executions_abandoned"], "status": run["status"],
                               "more_pending_orgs": run["more_pending_orgs"], "left": left})  # fmt: skip
                common.log(f"  pass {len(passes)}: {run['requests_recovered']:,} recovered in {seconds:.2f} s, {left:,} left")
        rounds.append({"bare_update_rows": updated, "bare_update_seconds": bare_seconds, "bare_update_cpu": bare_cpu,
                       "recovered": sum(p["recovered"] for p in passes),
                       "pass_seconds": sum(p["seconds"] for p in passes),
                       "pass_cpu": sum(p["cpu"] or 0 for p in passes), "passes": passes})  # fmt: skip
        if r + 1 < sizes.recovery_rounds:
            target.drop_database("recovery_run")

    best_bare = min(rounds, key=lambda x: x["bare_update_seconds"])
    best_run = min(rounds, key=lambda x: x["pass_seconds"])
    updated, bare_seconds, bare_cpu = (best_bare["bare_update_rows"], best_bare["bare_update_seconds"],
                                       best_bare["bare_update_cpu"])  # fmt: skip
    bare_rate = updated / bare_seconds
    passes = best_run["passes"]
    recovered = sum(p["recovered"] for p in passes)
    pass_seconds = sum(p["seconds"] for p in passes)
    rate = recovered / pass_seconds
    violations_after, check_seconds = common.invariant_violations(target, "recovery_run")
    detail = {
        "rounds": rounds, "best_of": sizes.recovery_rounds,
        "stranded": total, "organizations": sizes.recovery_orgs, "load_seconds": load_seconds,
        "passes": passes, "recovered": recovered, "pass_seconds": pass_seconds,
        "bare_update_rows": updated, "bare_update_seconds": bare_seconds, "bare_update_cpu": bare_cpu,
        "pass_cpu": sum(p["cpu"] or 0 for p in passes),
        "invariants_after_load": violations_loaded, "invariants_after_passes": violations_after,
        "profile": profiler.top("recovery_run"),
    }  # fmt: skip
    row = common.Row("recovery", f"recovery: {total:,} stranded requests, {sizes.recovery_orgs} orgs, passes until done",
              rate, "recovered/s", bare_rate, "one bare set-based UPDATE", common.ratio(rate, bare_rate), ">= 0.25",
              detail)  # fmt: skip
    for name in ("recovery_run", "recovery"):
        target.drop_database(name)
    return [row], detail
