#!/usr/bin/env bash
# The main job, end to end: bootstrap (idempotent), then `llm-db demo`, which
# starts an ephemeral PostgreSQL, installs llm-db and walks through it.
# Arguments go to `llm-db demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
exec .venv/bin/llm-db demo "$@"
