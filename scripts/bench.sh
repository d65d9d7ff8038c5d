#!/usr/bin/env bash
# The benchmark, end to end: bootstrap (idempotent), the `bench` extra (matplotlib,
# for the pictures), then `python -m benchmarks.run`, whose arguments these are
# (`--quick`, `--only throughput`, ...). About 13 minutes on 2 CPUs; writes
# docs/benchmarks.json, docs/pass_cost.png and docs/stripes.png.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
.venv/bin/python -m pip install -q -e '.[test,bench]'
exec .venv/bin/python -m benchmarks.run "$@"
