"""The request path's reads of budget counters stay index lookups ("Speed: the
request path's write shape"): a settlement moves its request's counters and a refusal
reads the counter that refused, each by its full key, never by scanning every
organization's counters (which also prunes, and writes WAL for, every page it reads);
and an existing counter is held by a plain UPDATE, as exact under concurrency as the
upsert it spares (docs/benchmarks.md, "The write shape of a request")."""

from __future__ import annotations

import uuid

import psycopg
import pytest

from tests.helpers import (
    T0,
    InThread,
    admit,
    invariants,
    new_org,
    on_one_node,
    scalar,
    set_budget,
    settle,
    wait_blocked,
)

KEYS = 300  # counters of other keys: enough that the planner prefers the index to a scan

def counter_scans(conn: psycopg.Connection) -> tuple[int, int]:
    """(sequential, index) scans of llm.budget_counters in the current transaction."""
    row = conn.execute(
        """SELECT coalesce(seq_scan, 0), coalesce(idx_scan, 0) FROM pg_stat_xact_user_tables
            WHERE schemaname = 'llm' AND relname = 'budget_counters'"""
    ).fetchone()
    return row[0], row[1]


def counter_reads(conn: psycopg.Connection) -> tuple[int, int, int]:
    """(index scans, rows they fetched, sequential scans) of llm.budget_counters counted in this
    session and not yet reported."""
    row = conn.execute(
        """SELECT coalesce(idx_scan, 0), coalesce(idx_tup_fetch, 0), coalesce(seq_scan, 0)
             FROM pg_stat_xact_user_tables WHERE schemaname = 'llm' AND relname = 'budget_counters'"""
    ).fetchone()
    return row[0], row[1], row[2]


@on_one_node
def test_settlement_and_refusal_find_counters_by_their_key_not_by_a_scan(llm_conn):
    """With hundreds of counters, eight settlements (past PL/pgSQL's five custom plans, so its
    generic plan too) and a refusal read llm.budget_counters through its key only. The
    counter's lookup compared scope_id with IS NOT DISTINCT FROM, which no index can serve."""
    org = new_org(llm_conn, 10**9)
    set_budget(llm_conn, org, "api_key", "*", "day", 10**6)
    set_budget(llm_conn, org, "organization", None, "day", 10**6)  # a NULL scope_id too
    set_budget(llm_conn, org, "api_key", "full", "day", 100)
    llm_conn.execute(
        """SELECT count(*) FROM generate_series(1, %(n)s) AS k,
                  LATERAL llm.admit_invocation(%(org)s, 1, 'model-a', NULL, NULL, %(now)s,
                                               p_api_key => 'key-' || k) AS a""",
        {"n": KEYS, "org": org, "now": T0},
    )
    admit(llm_conn, org, 100, api_key="full")
    requests = [admit(llm_conn, org, 10, api_key=f"key-{k}")["id"] for k in range(1, 9)]
    llm_conn.execute("ANALYZE llm.budget_counters")

    with llm_conn.transaction():
        for inv in requests:
            assert settle(llm_conn, org, uuid.UUID(str(inv)), 7) == "settled"
        with pytest.raises(psycopg.Error) as refused, llm_conn.transaction():
            admit(llm_conn, org, 1, api_key="full")  # rolled back to its savepoint
        assert refused.value.sqlstate == "LL001"
        seq, idx = counter_scans(llm_conn)
        assert seq == 0, f"{seq} sequential scans of llm.budget_counters"
        assert idx >= 2 * len(requests)
    counters = KEYS + 2  # each key's, "full"'s and the organization's day
    assert scalar(llm_conn, "SELECT count(*) FROM llm.budget_counters") == counters
    assert invariants(llm_conn) == []


@on_one_node
def test_the_fast_path_probes_each_counter_by_its_whole_key(llm_conn):
    """Each counter a settlement moves within its rooms costs one index probe fetching one
    row, among hundreds of ids of its scope. Spelled "= OR both NULL", the UPDATE's generic
    plan made two probes under a BitmapOr (with statistics, as here) or probed only
    (organization, scope) and filtered every id and window of the scope (with none yet:
    15,000 counters, 49 rows filtered a move, measured). The organization's own counter
    (id NULL) is probed by its whole key too."""
    org = new_org(llm_conn, 10**9)
    set_budget(llm_conn, org, "organization", None, "day", 10**6)
    set_budget(llm_conn, org, "api_key", "*", "day", 10**6)
    llm_conn.execute(
        """SELECT count(*) FROM generate_series(1, %(n)s) AS k,
                  LATERAL llm.admit_invocation(%(org)s, 1, 'model-a', NULL, NULL, %(now)s,
                                               p_api_key => 'key-' || k) AS a""",
        {"n": KEYS, "org": org, "now": T0},
    )
    llm_conn.execute("ANALYZE llm.budget_counters")
    # past PL/pgSQL's five custom plans of each statement, on counters that exist
    requests = [admit(llm_conn, org, 10, api_key=f"key-{k}")["id"] for k in range(1, 15)]
    with llm_conn.transaction():
        # (a session's counts not yet reported are in the view too: the difference)
        before = counter_reads(llm_conn)
        for inv in requests:
            assert settle(llm_conn, org, uuid.UUID(str(inv)), 7) == "settled"
        reads = tuple(b - a for a, b in zip(before, counter_reads(llm_conn), strict=True))
    moves = 2 * len(requests)  # the key's day and the organization's day, each within its rooms
    assert reads == (moves, moves, 0), f"(index scans, rows fetched, sequential scans) {reads}"
    assert invariants(llm_conn) == []


@pytest.mark.parametrize("first_ends", ["commit", "rollback"])
def test_a_hold_waiting_for_an_open_hold_on_the_same_counter_decides_on_its_outcome(
    llm_conn, llm_connect, first_ends
):
    """An existing counter is held by a plain UPDATE whose WHERE is the fit. A second admission
    on the same key waits for the first's open hold, then decides on what it left: refused
    (LL001, naming the key) when the first committed 50 of the 100, admitted when it rolled
    back."""
    org = new_org(llm_conn, 10**6)
    set_budget(llm_conn, org, "api_key", "k", "day", 100)
    admit(llm_conn, org, 10, api_key="k")  # the counter exists: the UPDATE path
    first = llm_connect(autocommit=False)
    admit(first, org, 50, api_key="k")  # open: 60 of 100 held
    second = llm_connect()
    admission = InThread(lambda: admit(second, org, 50, api_key="k"))
    wait_blocked(llm_conn, second.info.backend_pid)

    getattr(first, first_ends)()

    if first_ends == "commit":
        with pytest.raises(psycopg.Error) as refused:
            admission.result()
        assert refused.value.sqlstate == "LL001"
        assert refused.value.diag.message_detail.startswith("k\nscope=api_key window=day ")
        assert "used=0 held=60 estimate=50" in refused.value.diag.message_detail
    else:
        assert admission.result()["hold_credits"] == 50
    # 10 + 50: the first's hold or the second's, never both
    assert scalar(llm_conn, "SELECT held_credits FROM llm.budget_counters WHERE organization_id = %s"
                            " AND scope_id = 'k'", [org]) == 60  # fmt: skip
    assert invariants(llm_conn) == []
