#!/usr/bin/env bash
# Run the test suite: bootstrap (idempotent), then pytest. Arguments go to pytest,
# e.g. `bash scripts/test.sh -k migrate` or `bash scripts/test.sh tests/test_lint.py`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
exec .venv/bin/pytest -q "$@"
