#!/usr/bin/env bash
# Make this checkout runnable: PostgreSQL 15 with pg_cron and plpgsql_check, PgBouncer
# (Debian 12 packages), and a .venv with llm-db installed editable with its test
# extras. Idempotent and quick when nothing is missing; safe to run every time.
set -euo pipefail
cd "$(dirname "$0")/.."

# postgresql-client-15 (also a dependency of postgresql-15): pg_isolation_regress and
# isolationtester, which tests/test_isolation.py runs;
# pgbouncer: the tests start a real one (llm_db.testing, llm_pgbouncer);
# prometheus: only for /usr/bin/promtool, which tests/test_metrics_exposition.py runs
# (`promtool check metrics`); its service is not started by the tests.
APT_PACKAGES=(postgresql-15 postgresql-client-15 postgresql-15-cron postgresql-15-plpgsql-check pgbouncer prometheus)

log() { printf 'bootstrap: %s\n' "$*" >&2; }

missing_packages() {
    local pkg
    for pkg in "${APT_PACKAGES[@]}"; do
        if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q '^install ok installed$'; then
            printf '%s\n' "$pkg"
        fi
    done
}

# --- system packages ------------------------------------------------------------
mapfile -t missing < <(missing_packages)
if ((${#missing[@]})); then
    if [[ $(id -u) -eq 0 ]]; then
        log "installing ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    else
        log "missing Debian packages: ${missing[*]}"
        log "install them as root, then run this again:"
        log "  sudo apt-get update && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y ${APT_PACKAGES[*]}"
        exit 1
    fi
fi

# --- python virtualenv ----------------------------------------------------------
PYTHON=${PYTHON:-}
if [[ -z $PYTHON ]]; then
    for candidate in python3.11 python3 python3.12 python3.13; do
        if command -v "$candidate" >/dev/null 2>&1 &&
            "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
            PYTHON=$candidate
            break
        fi
    done
fi
if [[ -z $PYTHON ]]; then
    log "no python3 >= 3.11 found (Debian 12: apt-get install python3 python3-venv)"
    exit 1
fi

if [[ ! -x .venv/bin/python ]]; then
    if ! "$PYTHON" -c 'import ensurepip, venv' 2>/dev/null; then
        if [[ $(id -u) -eq 0 ]]; then
            log "installing python3-venv"
            apt-get update -qq
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
        else
            log "python venv support is missing: sudo apt-get install -y python3-venv"
            exit 1
        fi
    fi
    log "creating .venv with $("$PYTHON" --version)"
    rm -rf .venv
    "$PYTHON" -m venv .venv
fi

# Reinstall only when the packaging metadata changed (an editable install picks
# up code changes by itself); the stamp is the hash of pyproject.toml.
stamp=.venv/.llm-db-installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [[ ! -f $stamp || $(cat "$stamp") != "$want" ]] || ! .venv/bin/python -c 'import llm_db' 2>/dev/null; then
    log "installing llm-db (editable, with test extras) into .venv"
    pip_log=$(mktemp)
    if ! .venv/bin/python -m pip install -q -e '.[test]' >"$pip_log" 2>&1; then
        cat "$pip_log" >&2
        rm -f "$pip_log"
        log "pip install failed"
        exit 1
    fi
    rm -f "$pip_log"
    printf '%s\n' "$want" >"$stamp"
fi
