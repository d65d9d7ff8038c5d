"""Run every llm-db benchmark and print one table.

    .venv/bin/python -m benchmarks.run            # full run, ~13 minutes on 2 cores
    .venv/bin/python -m benchmarks.run --quick    # smoke run with smaller sizes, ~1 minute
    .venv/bin/python -m benchmarks.run --dsn postgresql://user@host/postgres

Starts its own PostgreSQL 15 (the project's EphemeralServer, fsync and
synchronous_commit on) unless ``--dsn`` names a server on which it may create
and drop ``llmbench_*`` databases. Everything, pgbench's baseline included,
runs on the same server in the same run. Writes the table as JSON
(``--json``, default docs/benchmarks.json) and the pass-cost plot
(``--png``, default docs/pass_cost.png). See benchmarks/README.md.

The scenarios live in ``throughput.py``, ``recovery.py`` and ``passes.py``;
``common.py`` holds what they share. This module runs them and writes the results.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchmarks import common, driver, plot
from benchmarks.passes import bench_pass
from benchmarks.recovery import bench_recovery
from benchmarks.server import open_target
from benchmarks.throughput import bench_throughput

# ---------------------------------------------------------------- output


def format_figure(value: float | None, unit: str = "") -> str:
    if value is None:
        return "—"
    text = f"{value:,.0f}" if value >= 100 else f"{value:,.2f}"
    return f"{text} {unit}".strip()


def table_lines(rows: Sequence[common.Row], *, markdown: bool = False) -> list[str]:
    header = ["scenario", "figure", "baseline", "ratio", "target", "met?"]
    body = []
    for r in rows:
        met = {True: "yes", False: "NO", None: "—"}[r.met]
        unit = {"s per pass": "s", "s CPU per pass": "s CPU"}.get(r.unit, r.unit)
        body.append([
            r.scenario, format_figure(r.figure, unit),
            f"{format_figure(r.baseline, unit)} ({r.baseline_label})",
            "—" if r.ratio is None else f"{r.ratio:.2f}",
            r.target.replace(">=", "≥").replace("<=", "≤"), met,
        ])  # fmt: skip
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        return lines + ["| " + " | ".join(cells) + " |" for cells in body]
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(header)]

    def fmt(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

    return [fmt(header), fmt(["-" * w for w in widths])] + [fmt(b) for b in body]


def _git_state() -> dict[str, Any]:
    """The commit measured, and which SQL files differed from it (migrate reads the work tree)."""

    def git(*args: str) -> str:
        proc = subprocess.run(["git", "-C", str(common.ROOT), *args], capture_output=True, text=True)
        return proc.stdout.strip() if proc.returncode == 0 else ""

    changed = git("status", "--porcelain", "--", "sql", "migrations")
    return {"commit": git("rev-parse", "--short", "HEAD"), "uncommitted_sql": changed.splitlines()}


def _arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", help="use this server (creates and drops llmbench_* databases) "
                        "instead of starting an ephemeral one")  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="smaller sizes and shorter runs (~1 minute)")
    parser.add_argument("--json", type=Path, help="default: docs/benchmarks.json "
                        "(with --quick: benchmarks-quick.json in the temp directory)")  # fmt: skip
    parser.add_argument("--png", type=Path, help="default: docs/pass_cost.png "
                        "(with --quick: pass_cost-quick.png in the temp directory)")  # fmt: skip
    parser.add_argument("--stripes-png", type=Path, help="default: docs/stripes.png "
                        "(with --quick: stripes-quick.png in the temp directory)")  # fmt: skip
    parser.add_argument("--markdown", action="store_true", help="also print the table as Markdown")
    parser.add_argument("--profile", action="store_true",
                        help="record pg_stat_statements (track=all) per scenario into the JSON")  # fmt: skip
    parser.add_argument("--only", choices=["throughput", "recovery", "pass"], action="append",
                        help="run only these scenario groups (repeatable)")  # fmt: skip
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = _arguments(argv)
    sizes = common.QUICK if args.quick else common.FULL
    groups = args.only or ["throughput", "recovery", "pass"]
    # a smoke run never overwrites the committed figures
    out_dir = Path(tempfile.gettempdir()) if args.quick else common.ROOT / "docs"
    args.json = args.json or out_dir / ("benchmarks-quick.json" if args.quick else "benchmarks.json")
    args.png = args.png or out_dir / ("pass_cost-quick.png" if args.quick else "pass_cost.png")
    args.stripes_png = args.stripes_png or out_dir / ("stripes-quick.png" if args.quick else "stripes.png")

    started, load_before = common.now(), os.getloadavg()
    rows: list[common.Row] = []
    details: dict[str, Any] = {}
    with open_target(args.dsn, profile=args.profile) as target:
        settings = target.settings()
        if settings["fsync"] != "on" or settings["synchronous_commit"] != "on":
            common.log(f"WARNING: fsync={settings['fsync']} synchronous_commit={settings['synchronous_commit']}: "
                "figures are not durable-commit figures")  # fmt: skip
        fast_load = target.is_superuser()
        profiler = common.Profiler(target, args.profile)
        if "throughput" in groups:
            new_rows, details["throughput"] = bench_throughput(target, sizes, profiler)
            rows += new_rows
        if "recovery" in groups:
            new_rows, details["recovery"] = bench_recovery(target, sizes, profiler)
            rows += new_rows
        if "pass" in groups:
            new_rows, details["pass"] = bench_pass(target, sizes, fast_load)
            rows += new_rows
    finished = common.now()

    print()
    for line in table_lines(rows):
        print(line)
    if args.markdown:
        print()
        for line in table_lines(rows, markdown=True):
            print(line)

    meta = {
        "started_at": started.isoformat(), "finished_at": finished.isoformat(),
        "seconds": (finished - started).total_seconds(), "mode": "quick" if args.quick else "full",
        "server": "--dsn" if args.dsn else "ephemeral (llm_db.testing._server.EphemeralServer)",
        "settings": settings, "sizes": asdict(sizes), "cpus": os.cpu_count(),
        "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
        "python": platform.python_version(), "driver": driver.VIA, "git": _git_state(), "fk_checks_skipped_during_bulk_load": fast_load,
    }  # fmt: skip
    doc = {
        "meta": meta,
        "table": [
            {"key": r.key, "scenario": r.scenario, "figure": r.figure, "unit": r.unit, "baseline": r.baseline,
             "baseline_label": r.baseline_label, "ratio": r.ratio, "target": r.target, "met": r.met}
            for r in rows
        ],
        "details": details,
    }  # fmt: skip
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    common.log(f"wrote {args.json}")
    _plots(args, sizes, details)
    return 0


def _plots(args: argparse.Namespace, sizes: common.Sizes, details: dict[str, Any]) -> None:
    """The pass's cost over history and the request rate over stripes, as PNGs."""
    if "pass" in details:
        series = [("idle pass, wall clock", [p["history"] for p in details["pass"]["points"]],
                   [min(p["times"]) for p in details["pass"]["points"]])]  # fmt: skip
        if all(p["cpu"] for p in details["pass"]["points"]):
            series.append(("idle pass, CPU of the backend running it",
                           [p["history"] for p in details["pass"]["points"]],
                           [min(p["cpu"]) for p in details["pass"]["points"]]))  # fmt: skip
        last = details["pass"]["points"][-1]["history"]
        series.append((f"with {sizes.drift_tasks:,} closed tasks in the drift window, wall clock", [last],
                       [min(details["pass"]["drift_times"])]))  # fmt: skip
        plot.pass_cost(args.png, series, orgs=sizes.pass_orgs,
                       note=f"best of {sizes.pass_repeats} hourly passes after a warm-up pass; fsync on; "
                       f"{os.cpu_count()} CPUs")  # fmt: skip
        common.log(f"wrote {args.png}")
    if "throughput" in details:
        by_count = details["throughput"]["stripes"]
        counts = sorted(int(c) for c in by_count)
        plot.stripes(args.stripes_png, counts, [by_count[c] for c in counts],
                     spread=sum(details["throughput"]["spread_runs"]) / 2,
                     simple_update=details["throughput"]["simple_update"]["tps"], clients=sizes.clients,
                     note=f"pgbench, {sizes.pgbench_seconds} s per point; fsync on; {os.cpu_count()} CPUs")  # fmt: skip
        common.log(f"wrote {args.stripes_png}")


if __name__ == "__main__":
    sys.exit(main())
