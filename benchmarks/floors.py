"""The floors in interleaved rounds: ``python -m benchmarks.floors [--rounds N]``.

One ephemeral durable server set up as the throughput group sets up its request
database (benchmarks/throughput.py), then, round after round and each round in
another order, pgbench on floor.sql and its variants under three budgets
(floor_budgets.sql; _each, one UPDATE per counter; _read, their read alone;
_writes, their writes alone), cycle.sql, cycle_budget_rows.sql (the cycle plus
the counters' writes, unchecked), cycle_budget_floor (the same plus the budgets'
read: what any code keeping three budgets must add to the cycle), budgets.sql and
budgets_off_row (budgets.sql with admission reading the budgets, not the
organizations' rows) and priced.sql (the priced cycle, against the cycle of its
round as the price book's target sets it), a VACUUM ANALYZE and a CHECKPOINT before each (``--scripts``: some of them). A single run of each moves by several
percent on a noisy machine; rounds side by side say what the floors bound
(docs/benchmarks.md "Why the two targets are short"). Prints each run and,
per round, the time a request's budgets (their rows, read and writes) add to the
floor and their writes to the cycle, against the time the target of 0.85 leaves
them on the cycle; writes the runs as JSON.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import common, throughput
from benchmarks.server import open_target

# the budget bits of the budgets queries.SET_BUDGETS sets: a project's month, a key's day
_MASK = "SELECT (1 << llm._budget_slot('project', 'month')) | (1 << llm._budget_slot('api_key', 'day'))"


def _scripts(sizes: common.Sizes, variants: Path) -> dict[str, tuple[str, list[str]]]:
    first = sizes.cycle_orgs + 1
    keys = ["-D", f"nprojects={sizes.budget_projects}", "-D", f"nkeys={sizes.budget_keys}"]
    spread = ["-D", f"first={first}", "-D", f"norgs={sizes.cycle_orgs}", *keys]
    plain = ["-D", f"norgs={sizes.cycle_orgs}"]
    return {
        "floor": (str(common.SCRIPTS / "floor.sql"), plain),
        "floor_budgets": (str(common.SCRIPTS / "floor_budgets.sql"), spread),
        "floor_budgets_each": (str(variants / "floor_budgets_each.sql"), spread),
        "floor_budgets_read": (str(variants / "floor_budgets_read.sql"), spread),
        "floor_budgets_writes": (str(variants / "floor_budgets_writes.sql"), spread),
        "cycle": (str(common.SCRIPTS / "cycle.sql"), plain),
        "cycle_budget_rows": (str(common.SCRIPTS / "cycle_budget_rows.sql"),
                              [*plain, *keys, "-D", f"offset={sizes.cycle_orgs}"]),
        "cycle_budget_floor": (str(variants / "cycle_budget_floor.sql"),
                               [*plain, *keys, "-D", f"offset={sizes.cycle_orgs}"]),
        "budgets": (str(common.SCRIPTS / "budgets.sql"), spread),
        "budgets_off_row": (str(common.SCRIPTS / "budgets.sql"), spread),
        "priced": (str(common.SCRIPTS / "priced.sql"), plain),
    }


# ---------------------------------------------------------------- the variants
#
# Four variants of the floors, written from floor.sql, floor_budgets.sql and
# cycle_budget_rows.sql at each run (pgbench has no include, and copies would drift
# from the floors they vary):
#   floor_budgets_each    floor_budgets.sql with one UPDATE per counter, as the package
#                         moves them, instead of one UPDATE of both joined to a VALUES list;
#   floor_budgets_writes  floor_budgets.sql without the budgets' read: each request
#                         carries the mask that read finds in this database;
#   floor_budgets_read    floor.sql on the organizations with budgets, plus the budgets'
#                         read (a request is booked only when they are found, so it cannot
#                         be skipped) and no counter moved: mask 0, the books stay exact;
#   cycle_budget_floor    cycle_budget_rows.sql plus the budgets' read at admission (the
#                         budgets that apply, the budgets revision; the counters move only
#                         when they are found) and the revision's at settlement.
# Each change names the text it replaces and fails when a floor no longer has it.

_COUNTERS = "(VALUES ('project', 'project-' || :p, 'month'), ('api_key', 'key-' || :n || '-' || :k, 'day'))"
_KEYS = (("project", "'project-' || :p", "month"), ("api_key", "'key-' || :n || '-' || :k", "day"))


def _replace(text: str, old: str, new: str) -> str:
    if text.count(old) != 1:
        raise SystemExit(f"benchmarks.floors: a floor script changed, {old[:60]!r} is not in it once")
    return text.replace(old, new)


def _statements(text: str) -> str:
    """A script from its first pgbench command on (its header comment dropped)."""
    return text[text.index("\\set n random"):]


def _budgets_read(budgets: str) -> str:
    """floor_budgets.sql's read of the budgets that apply: its CTE ``b``, from ``), b AS (``."""
    return budgets[budgets.index("), b AS (\n"):budgets.index("), i AS (\n")]


def _one_update_each(block: str) -> list[str]:
    """The counters' UPDATE of floor_budgets.sql (both counters, joined to a VALUES list)
    as one UPDATE per counter, the project's month first."""
    indent = "      " if block.startswith("    UPDATE") else "  "  # admission's CTE, or settlement's statement
    block = _replace(block, f"\n{indent}FROM i, o, {_COUNTERS}\n{indent}       AS k (scope, scope_id, budget_window)",
                     f"\n{indent}FROM i, o")
    out = []
    for scope, scope_id, window in _KEYS:
        out.append(block.replace("c.scope = k.scope AND c.scope_id = k.scope_id", f"c.scope = '{scope}' AND c.scope_id = {scope_id}")
                        .replace("c.budget_window = k.budget_window", f"c.budget_window = '{window}'")
                        .replace("llm._window_start(k.budget_window,", f"llm._window_start('{window}',"))  # fmt: skip
    return out


def write_variants(directory: Path, mask: int) -> None:
    """floor_budgets_each.sql, floor_budgets_writes.sql and floor_budgets_read.sql in
    ``directory``; ``mask``: the budget bits the budgets' read finds here."""
    budgets = _statements((common.SCRIPTS / "floor_budgets.sql").read_text())
    admit_c = budgets[budgets.index("), c AS (\n"):budgets.index("\nSELECT i.id AS inv FROM i \\gset")]
    first_c, second_c = _one_update_each(admit_c[len("), c AS (\n"):].removesuffix(")"))
    each = _replace(budgets, admit_c, f"), c1 AS (\n{first_c}), c2 AS (\n{second_c})")
    settle_c = each[each.index(")\nUPDATE llm.budget_counters AS c\n"):]
    first_s, second_s = _one_update_each(settle_c[len(")\n"):].rstrip().removesuffix(";"))
    each = each.replace(settle_c, f"), c1 AS (\n    {first_s}\n)\n{second_s};\n")
    (directory / "floor_budgets_each.sql").write_text(each)

    read = _budgets_read(budgets)
    writes = _replace(budgets, read, "")
    writes = _replace(writes, "b.mask, pg_backend_pid() % 64\n      FROM o, x, b WHERE",
                      f"{mask}, pg_backend_pid() % 64\n      FROM o, x WHERE")
    (directory / "floor_budgets_writes.sql").write_text(writes)

    floor = _statements((common.SCRIPTS / "floor.sql").read_text())
    floor = _replace(floor, "\\set n random(1, :norgs)\n",
                     "\\set n random(:first, :first + :norgs - 1)\n\\set p random(1, :nprojects)\n\\set k random(1, :nkeys)\n")
    floor = _replace(floor, "SELECT o.status FROM llm.organizations", "SELECT o.status, o.budgets_revision FROM llm.organizations")
    floor = _replace(floor, "), i AS (\n", read + "), i AS (\n")
    floor = _replace(floor, "FROM o, x WHERE o.status = 'operational' AND x.status = 'running'\n",
                     "FROM o, x, b WHERE o.status = 'operational' AND x.status = 'running' AND b.mask > 0\n")
    (directory / "floor_budgets_read.sql").write_text(floor)

    write_cycle_budget_floor(directory)


def write_cycle_budget_floor(directory: Path) -> Path:
    """cycle_budget_floor.sql in ``directory``: the cycle plus what code keeping three
    budgets as the books do must add to it, their read (the budgets that apply, as
    admission reads them, and the budgets revision, at admission and at settlement) and
    the counters' writes, with no check; of organization n + offset, as in
    cycle_budget_rows.sql."""
    read = _budgets_read(_statements((common.SCRIPTS / "floor_budgets.sql").read_text()))
    rows = _statements((common.SCRIPTS / "cycle_budget_rows.sql").read_text())
    revision = "    SELECT o.budgets_revision FROM llm.organizations AS o WHERE o.id = md5('bench-org-' || :m)::uuid\n"
    rows = _replace(rows, "WITH a AS (\n", "WITH o AS (\n" + revision + read.replace(":n", ":m") + "), a AS (\n")
    rows = _replace(rows, "AS outcome\n), c AS (\n", "AS outcome\n), o AS (\n" + revision + "), c AS (\n")
    for side in ("a", "s"):
        rows = _replace(rows, f"      FROM {side}, (VALUES", f"      FROM {side}, o, (VALUES")
    rows = rows.replace("       AND c.stripe = 0\n", "       AND c.stripe = 0 AND o.budgets_revision IS NOT NULL\n")
    rows = _replace(rows, "AND o.budgets_revision IS NOT NULL\n)\nSELECT a.id",
                    "AND o.budgets_revision IS NOT NULL AND b.mask > 0\n)\nSELECT a.id")
    rows = _replace(rows, "      FROM a, o, (VALUES", "      FROM a, o, b, (VALUES")
    (directory / "cycle_budget_floor.sql").write_text(rows)
    return directory / "cycle_budget_floor.sql"


# Each figure of a round: its name, then (minuend, subtrahend) scripts, or the cycle's
# share the target leaves. In µs a request at 8 clients (1 / throughput), then the same
# from the machine's CPU a request (pgbench's included).
_DIFFERENCES = {
    "budget_rows": ("floor_budgets", "floor"),
    "budget_rows_each": ("floor_budgets_each", "floor"),
    "budget_read": ("floor_budgets_read", "floor"),
    "budget_writes": ("floor_budgets_writes", "floor"),
    "budget_writes_on_cycle": ("cycle_budget_rows", "cycle"),
    "budget_floor_on_cycle": ("cycle_budget_floor", "cycle"),
    "cycle_logic": ("cycle", "floor"),
    "budgets_add": ("budgets", "cycle"),
    "budgets_row_saves": ("budgets_off_row", "budgets"),
}


def _round_figures(tps: dict[str, float], machine_cpu: dict[str, float | None]) -> dict[str, float]:
    """What the budgets' rows, read and writes add to the floor, what their writes add to
    the cycle, the package's budgets to the cycle, and what the target leaves the budgets
    on top of the cycle: in µs a request at 8 clients (1 / throughput), and as the
    machine's CPU a request (``cpu_`` figures; pgbench's included). Only the figures
    whose scripts ran."""
    per_request = {name: 1e6 / rate for name, rate in tps.items()}
    cpu = {name: value for name, value in machine_cpu.items() if value is not None}
    figures: dict[str, float] = {}
    for prefix, costs in (("", per_request), ("cpu_", cpu)):
        for figure, (minuend, subtrahend) in _DIFFERENCES.items():
            if minuend in costs and subtrahend in costs:
                figures[f"{prefix}{figure}_us"] = round(costs[minuend] - costs[subtrahend], 1)
        if "cycle" in costs:
            figures[f"{prefix}target_leaves_us"] = round(costs["cycle"] * (1 / common.BUDGETS_TARGET - 1), 1)
    # against the target itself: each cycle under budgets (or their floor) / the cycle
    for name in ("budgets", "budgets_off_row", "cycle_budget_rows", "cycle_budget_floor", "priced"):
        if name in tps and "cycle" in tps:
            figures[f"{name}_vs_cycle"] = round(tps[name] / tps["cycle"], 3)
    return figures


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.floors", description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=20, help="each pgbench run")
    parser.add_argument("--json", type=Path, default=Path("/tmp/benchmarks-floors.json"))
    parser.add_argument("--scripts", help="a comma-separated subset of the scripts, in that order (default: all);"
                        " figures that need a script left out are not computed")  # fmt: skip
    args = parser.parse_args(argv)
    sizes = common.FULL
    rounds: list[dict[str, Any]] = []
    with open_target(None) as target, tempfile.TemporaryDirectory(prefix="llmbench-floors-") as variants:
        throughput.load_request_database(target, sizes)
        throughput.prefill_counters(target, sizes)
        with target.connect("cycle") as conn:
            mask = conn.execute(_MASK).fetchone()[0]
        write_variants(Path(variants), mask)
        scripts = _scripts(sizes, Path(variants))
        loaded, _ = common.invariant_violations(target, "cycle")
        for name in ("cycle", "budgets"):  # warm-up: the plans of the tables as loaded
            path, extra = scripts[name]
            common.pgbench(target, "cycle", common.run_args(sizes, "-n", "-f", path, *extra,
                                                            seconds=sizes.warmup_seconds))  # fmt: skip
        names = args.scripts.split(",") if args.scripts else list(scripts)
        if not set(names) <= set(scripts):
            raise SystemExit(f"benchmarks.floors: --scripts takes some of {', '.join(scripts)}")
        for number in range(1, args.rounds + 1):
            tps: dict[str, float] = {}
            runs: dict[str, Any] = {}
            shift = (number - 1) % len(names)  # each round starts one script later: no fixed position
            for name in names[shift:] + names[:shift]:
                path, extra = scripts[name]
                with throughput.around_run(target, name):  # budgets_off_row: read, not from the rows
                    common.settle(target, "cycle", sizes)
                    run = common.pgbench(target, "cycle", common.run_args(sizes, "-n", "-f", path, *extra,
                                                                          seconds=args.seconds))  # fmt: skip
                tps[name] = run["tps"]
                runs[name] = {k: run.get(k) for k in ("tps", "wal_bytes_per_run", "session_states",
                                                      "server_cpu_us_per_run", "machine_cpu_us_per_run",
                                                      "machine_shares")}  # fmt: skip
                common.log(f"round {number} {name}: {run['tps']:.0f} requests/s, "
                           f"{run['wal_bytes_per_run']} WAL bytes each, machine CPU "
                           f"{run.get('machine_cpu_us_per_run')} us each, {run.get('machine_shares')}")  # fmt: skip
            machine_cpu = {name: run["machine_cpu_us_per_run"] for name, run in runs.items()}
            rounds.append({"runs": runs, **_round_figures(tps, machine_cpu)})
            common.log(f"round {number}: " + ", ".join(
                f"{k} {v}" for k, v in rounds[-1].items() if k != "runs"))  # fmt: skip
        violations, _ = common.invariant_violations(target, "cycle")
    common.log(f"invariant violations after the rounds: {violations}")
    args.json.write_text(json.dumps({"rounds": rounds, "invariant_violations_after_load": loaded,
                                     "invariant_violations": violations}, indent=2) + "\n")  # fmt: skip
    common.log(f"wrote {args.json}")
    return 1 if violations or loaded else 0


if __name__ == "__main__":
    raise SystemExit(main())
