"""The SQL constructs Citus is known to mishandle, kept out of sql/ by a lint
(docs/scaling.md "Constructs Citus mishandles").

A single-node test cannot see them: each ran fine on plain PostgreSQL and failed only
on a 3-node Citus 13.2.2 cluster (the budgets-airtight attacks on 0.3.0). The checks
read the SQL as text, comments dropped; each rule is also fed a bad snippet, to show it
is caught.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SQL_FILES = sorted((ROOT / "sql").glob("*.sql"))
AGGREGATE = re.compile(r"\b(?:sum|count|min|max|avg|array_agg|jsonb_object_agg|bool_or|bool_and)\s*\(", re.I)


def _code(sql: str) -> str:
    """The SQL without comments or string literals' contents, on one line."""
    sql = re.sub(r"--[^\n]*", "", sql)
    sql = re.sub(r"'(?:[^']|'')*'", "''", sql)
    return re.sub(r"\s+", " ", sql)


def _statements(code: str) -> list[str]:
    return [s.strip() for s in code.split(";") if s.strip()]


def _without_subqueries(text: str) -> str:
    """``text`` without its parenthesized ``(SELECT ...)`` groups."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "(" and text[i + 1:i + 7].upper() == "SELECT":
            depth = 0
            while i < len(text):
                depth += {"(": 1, ")": -1}.get(text[i], 0)
                i += 1
                if depth == 0:
                    break
            continue
        out.append(text[i])
        i += 1
    return "".join(out)


def volatile_functions(sql: str) -> set[str]:
    """The functions ``sql`` creates VOLATILE (stated, or by default), and PostgreSQL's
    volatile ones the package calls."""
    out = {"gen_random_uuid", "random", "clock_timestamp", "nextval", "pg_backend_pid"}
    for m in re.finditer(r"CREATE (?:OR REPLACE )?FUNCTION llm\.(\w+)\s*\((.*?)\$\$", _code(sql), re.I | re.S):
        if not re.search(r"\b(?:IMMUTABLE|STABLE)\b", m.group(2), re.I):
            out.add(m.group(1).lower())
    return out


VOLATILE = set().union(*(volatile_functions(p.read_text(encoding="utf-8")) for p in SQL_FILES))


def violations(name: str, sql: str, volatile: set[str] = VOLATILE) -> list[str]:
    """What file ``name`` with text ``sql`` does that Citus mishandles."""
    found: list[str] = []
    code = _code(sql)
    statements = _statements(code)
    # 1. a simple CASE in a distributed statement is rewritten wrongly (42883)
    for m in re.finditer(r"\bCASE\s+(?!WHEN\b)(\S+)", code, re.I):
        found.append(f"{name}: simple CASE ({m.group(0)} ...): write CASE WHEN x = ... instead")
    for i, statement in enumerate(statements):
        # 2. an array element in a distributed UPDATE's SET crashed a worker
        update = re.search(r"\bUPDATE\s+llm\.\w+.*?\bSET\b(.*?)(?:\bWHERE\b|\bFROM\b|\bRETURNING\b|$)",
                           statement, re.I)  # fmt: skip
        if update and re.search(r"\w\s*\[", update.group(1)):
            found.append(f"{name}: an array element in UPDATE ... SET: read it into a variable first")
        # 3. FOUND / ROW_COUNT after an INSERT ... SELECT ... ON CONFLICT count the rows
        #    the conflict skipped (an INSERT ... VALUES ... RETURNING INTO is delegated
        #    whole, and reads right)
        #    the conflict skipped, and its RETURNING ... INTO fails (XX000, "consistency check
        #    on SPI tuple count failed"): read RETURNING through a CTE
        insert_select = re.match(r"INSERT INTO [\w.]+(?: AS \w+)? \([^)]*\) SELECT\b", statement, re.I)
        if insert_select and re.search(r"\bON CONFLICT\b", statement, re.I):
            if re.search(r"\bRETURNING\b[^;]*\bINTO\b", statement, re.I):
                found.append(f"{name}: RETURNING ... INTO of INSERT ... SELECT ... ON CONFLICT: read it through a CTE")
            after = statements[i + 1] if i + 1 < len(statements) else ""
            if re.match(r"(?:GET DIAGNOSTICS \w+ = ROW_COUNT|IF (?:NOT )?FOUND\b|RETURN FOUND)", after, re.I):
                found.append(f"{name}: {after.split()[0]} ... after ON CONFLICT: read RETURNING instead")
        # 4. a scalar subquery beside aggregates in a view cannot be pushed down (0A000)
        view = re.match(r"CREATE (?:OR REPLACE )?VIEW \S+ AS SELECT (.*?) FROM ", statement, re.I)
        if view:
            select_list = view.group(1)
            if "(SELECT" in select_list.upper() and AGGREGATE.search(_without_subqueries(select_list)):
                found.append(f"{name}: a scalar subquery beside aggregates in a view: join two aggregates")
        # 5. a function reading a table inside a query over distributed tables (XX000)
        if re.search(r"\bllm\._settings\(\)", statement) and re.search(
            r"(?:^|\b)(?:RETURN QUERY|SELECT|WITH|INSERT|DELETE)\b.*\bFROM llm\.(?!settings\b)\w+", statement, re.I
        ):
            found.append(f"{name}: llm._settings() inside a query over the tables: read it into a variable first")
        # 6. a VOLATILE function in a distributed UPDATE (0A000 "functions used in UPDATE
        #    queries on distributed tables must not be VOLATILE")
        #    (the coordinator's own tables are not distributed)
        update = re.search(r"(?:^|\s)UPDATE llm\.(?!reconciliation_runs\b|pass_lease\b)\w+.*", statement, re.I)
        if update:
            for call in re.findall(r"\b((?:llm|pg_catalog)\.\w+|\w+)\s*\(", update.group(0)):
                if call.split(".")[-1].lower() in volatile:
                    found.append(f"{name}: VOLATILE {call}() in an UPDATE: call it before, or refuse after")
        # 7. a correlated (LATERAL) subquery with a set-returning function in its FROM
        #    (0A000 "correlated subqueries are not supported when the FROM clause contains a
        #    set returning function": invariant 18 of 0.4.0's first cut)
        for group in _lateral_subqueries(statement):
            if SET_RETURNING.search(group):
                found.append(f"{name}: a set-returning function inside LATERAL (SELECT ...): aggregate it in a "
                             "derived table joined on the organization instead")
    # 8. a handler of a unique violation: a shard's 23505 under a multi-shard INSERT comes
    #    back as XX000 with the message only (the rebuild of daily usage racing a true-up)
    #    (named in any handler's list, or as its class, or by its code)
    uncommented = re.sub(r"--[^\n]*", "", sql)
    if re.search(r"\b(?:unique_violation|integrity_constraint_violation)\b|\bSQLSTATE\s+'23(?:505|000)'",
                 uncommented, re.I):
        found.append(f"{name}: a handler of unique_violation: insert ON CONFLICT DO NOTHING and count RETURNING")
    return found


SET_RETURNING = re.compile(r"\b(?:llm\._budget_keys|(?:pg_catalog\.)?unnest|(?:pg_catalog\.)?generate_series)\s*\(", re.I)


def _lateral_subqueries(statement: str) -> list[str]:
    """The text of each ``LATERAL (SELECT ...)`` group of ``statement``."""
    groups = []
    for m in re.finditer(r"\bLATERAL\s*\(\s*SELECT\b", statement, re.I):
        start = statement.index("(", m.start())
        depth, i = 0, start
        while i < len(statement):
            depth += {"(": 1, ")": -1}.get(statement[i], 0)
            i += 1
            if depth == 0:
                break
        groups.append(statement[start:i])
    return groups


@pytest.mark.parametrize("path", SQL_FILES, ids=lambda p: p.name)
def test_no_file_of_sql_uses_a_construct_citus_mishandles(path):
    """docs/scaling.md "Constructs Citus mishandles": none of them in sql/."""
    assert violations(path.name, path.read_text(encoding="utf-8")) == []


BAD = {
    "simple CASE": "SELECT CASE c.budget_window WHEN 'day' THEN 1 END FROM llm.budget_counters AS c;",
    "array element": "UPDATE llm.budget_counters AS c SET admitted_limit = p_limits[v_i] WHERE c.id = v_id;",
    "ROW_COUNT after ON CONFLICT": (
        "INSERT INTO llm.threshold_notices (a) SELECT 1 ON CONFLICT (a) DO NOTHING;"
        " GET DIAGNOSTICS v_created = ROW_COUNT;"
    ),
    "FOUND after ON CONFLICT": (
        "INSERT INTO llm.budget_counters AS c (a) SELECT 1 ON CONFLICT (a) DO UPDATE SET a = 2 WHERE c.a < 3;"
        " IF FOUND THEN RETURN; END IF;"
    ),
    "scalar subquery beside aggregates": (
        "CREATE OR REPLACE VIEW llm.sweep_summary AS SELECT coalesce(sum(t.n), 0) AS n,"
        " (SELECT count(*) FROM llm.period_findings AS f) AS findings FROM llm.sweep_totals AS t;"
    ),
    "RETURNING INTO after INSERT ... SELECT ... ON CONFLICT": (
        "INSERT INTO llm.budget_counters AS c (a) SELECT 1 ON CONFLICT (a) DO UPDATE SET a = 2 WHERE c.a < 3"
        " RETURNING c.id INTO v_held;"
    ),
    "a VOLATILE function in an UPDATE": (
        "UPDATE llm.budget_counters AS c SET used_credits = CASE WHEN c.used_credits > llm._max_sum()"
        " THEN llm._refuse_sum('budget_counters', 'used_credits', c.used_credits, 'x') ELSE 1 END"
        " WHERE c.id = v_id;"
    ),
    "a set-returning function in a LATERAL subquery": (
        "SELECT c.id FROM llm.budget_counters AS c LEFT JOIN LATERAL (SELECT sum(i.hold_credits) AS held"
        " FROM llm.invocations AS i CROSS JOIN LATERAL llm._budget_keys(i.budget_mask, i.project, i.api_key,"
        " i.end_user, i.created_at) AS k WHERE i.organization_id = c.organization_id) AS h ON true;"
    ),
    "a handler of unique_violation": (
        "FOR v_attempt IN 1 .. 3 LOOP BEGIN DELETE FROM llm.daily_usage AS d WHERE d.day = p_day;"
        " INSERT INTO llm.daily_usage (a) SELECT 1; EXIT; EXCEPTION WHEN unique_violation THEN NULL; END; END LOOP;"
    ),
    "unique_violation in a handler's list": (
        "BEGIN INSERT INTO llm.daily_usage (a) SELECT 1;"
        " EXCEPTION WHEN foreign_key_violation OR unique_violation THEN NULL; END;"
    ),
    "a handler of the class 23000": (
        "BEGIN INSERT INTO llm.daily_usage (a) SELECT 1; EXCEPTION WHEN integrity_constraint_violation THEN NULL; END;"
    ),
    "a handler of SQLSTATE 23505": "BEGIN INSERT INTO llm.daily_usage (a) SELECT 1; EXCEPTION WHEN SQLSTATE '23505' THEN NULL; END;",
    "_settings() in a query": (
        "RETURN QUERY SELECT count(*) FROM llm.invocations AS r"
        " WHERE r.created_at <= p_now - (llm._settings()).recovery_window;"
    ),
}


@pytest.mark.parametrize("construct", sorted(BAD))
def test_the_lint_catches_each_construct(construct):
    assert violations("bad.sql", BAD[construct]) != []


def test_the_lint_passes_the_forms_that_replace_them():
    good = (
        "SELECT CASE WHEN c.budget_window = 'day' THEN 1 END FROM llm.budget_counters AS c;"
        " v_limit := p_limits[v_i];"
        " UPDATE llm.budget_counters AS c SET admitted_limit = v_limit WHERE c.id = v_id;"
        " WITH held AS (INSERT INTO llm.budget_counters AS c (a) SELECT 1 ON CONFLICT (a) DO NOTHING"
        " RETURNING c.id) SELECT h.id INTO v_held FROM held AS h;"
        " UPDATE llm.budget_counters AS c SET used_credits = c.used_credits + 1"
        " WHERE c.id = v_id AND c.used_credits < llm._max_sum();"
        " v_stale_before := p_now - (llm._settings()).recovery_window;"
        " CREATE OR REPLACE VIEW llm.sweep_summary AS SELECT t.n, f.findings"
        " FROM (SELECT coalesce(sum(s.n), 0) AS n FROM llm.sweep_totals AS s) AS t"
        " CROSS JOIN (SELECT count(*) AS findings FROM llm.period_findings AS p) AS f;"
    )
    assert violations("good.sql", good) == []
