"""Every migration from 0010 on follows the expand/contract rules and the lock order
of docs/architecture.md, "Conventions" 14 and 15: what a test can check
in the text. Each rule is also fed a bad snippet, to show it is caught.

The checks read SQL as text, without a parser: comments are kept where a rule reads
them (the ``-- bounded:`` and ``-- batched:`` marks) and dropped elsewhere.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DESIGN = ROOT / "docs" / "architecture.md"
FIRST_CHECKED = 10  # the rules came with 0.3.0's upgrades; 0001 .. 0009 landed before

LARGE_TABLES = ("llm.invocations", "llm.executions", "llm.threshold_notices", "llm.daily_usage")

# Landed before the marks existed (a landed migration is never edited, Conventions 5):
# 0011 updates the notices being sent, few rows (its header: index threshold_notices_sending).
GRANDFATHERED = {("0011_notice_claim_tokens", "UPDATE llm.threshold_notices")}


def lock_order() -> list[str]:
    """The tables of docs/architecture.md's "lock order of migrations:" line, in order."""
    text = re.sub(r"\s+", " ", DESIGN.read_text(encoding="utf-8"))
    found = re.search(r"lock order of migrations: (.*?)\.(?: |$)", text)
    assert found, 'docs/architecture.md, Conventions 15, lost its "lock order of migrations:" line'
    return re.findall(r"`(llm\.\w+)`", found[1])


def _code(sql: str) -> str:
    """The SQL without its comments, on one line."""
    return re.sub(r"\s+", " ", re.sub(r"--[^\n]*", "", sql))


def violations(name: str, sql: str) -> list[str]:
    """What migration ``name`` (its file's stem) with text ``sql`` breaks."""
    found: list[str] = []
    code = _code(sql)
    large = "|".join(re.escape(t) for t in LARGE_TABLES)
    non_transactional = re.search(r"^-- transactional: false$", sql, re.M | re.I) is not None

    # a column that constrains what it holds: a domain of llm, or a clause
    for table, body in re.findall(
        rf"ALTER TABLE (?:ONLY )?(?:IF EXISTS )?({large})\b(.*?);", code, re.I
    ):
        for column in re.findall(r"ADD (?:COLUMN )?(?:IF NOT EXISTS )?(.*?)(?=, ADD |, DROP |, ALTER |$)",
                                 body, re.I):  # fmt: skip
            if re.search(r"\bllm\.\w+|\bNOT NULL\b|\bDEFAULT\b|\bCHECK\b|\bREFERENCES\b|\bUNIQUE\b"
                         r"|\bPRIMARY KEY\b|\bGENERATED\b", column, re.I) and not re.match(
                             r"CONSTRAINT \w+ .* NOT VALID$", column.strip(), re.I):  # fmt: skip
                found.append(f"{name}: {table} gets a constrained column ({column.strip()})")

    for table in re.findall(
        rf"CREATE (?:UNIQUE )?INDEX (?!CONCURRENTLY)(?:IF NOT EXISTS )?\w* ?ON (?:ONLY )?({large})\b",
        code,
        re.I,
    ):
        found.append(f"{name}: CREATE INDEX on {table} without CONCURRENTLY")
    if re.search(r"\bCONCURRENTLY\b", code, re.I) and not non_transactional:
        found.append(f"{name}: CONCURRENTLY in a migration not marked -- transactional: false")

    # UPDATE / DELETE of a large table: a WHERE, and the mark on the line above
    lines = sql.splitlines()
    for i, line in enumerate(lines):
        for verb, table in re.findall(
            rf"\b(UPDATE|DELETE FROM) ({large})\b", re.sub(r"--.*", "", line), re.I
        ):
            statement = _code("\n".join(lines[i:])).split(";")[0]
            above = lines[i - 1].strip() if i else ""
            what = f"{verb.upper()} {table}"
            if (name, what) in GRANDFATHERED:
                continue
            if not re.search(r"\bWHERE\b", statement, re.I):
                found.append(f"{name}: {what} of the whole table")
            elif above.startswith("-- batched:"):
                if not (non_transactional and re.search(r"\bCOMMIT\b", code, re.I)):
                    found.append(f"{name}: {what} marked batched, but no batch is committed "
                                 "(-- transactional: false, COMMIT in the loop)")  # fmt: skip
            elif not above.startswith("-- bounded:"):
                found.append(f"{name}: {what} without a -- bounded: or -- batched: line above")

    for what in re.findall(r"\b(DROP TABLE [\w.]+|DROP VIEW [\w.]+|DROP (?:COLUMN )?(?:IF EXISTS )?\w+(?= *[,;])"
                           r"|RENAME (?:COLUMN |TO )?\w+)", code, re.I):  # fmt: skip
        if not re.match(
            r"DROP (CONSTRAINT|INDEX|ROUTINE|FUNCTION|PROCEDURE|TRIGGER)\b", what, re.I
        ):
            found.append(f"{name}: {what} (contract in the next release)")

    order = lock_order()
    taken = [t for t in re.findall(r"(?:LOCK TABLE|ALTER TABLE) (?:ONLY )?(?:IF EXISTS )?(llm\.\w+)", code, re.I)
             if t in order]  # fmt: skip
    for earlier, later in zip(taken, taken[1:], strict=False):
        if order.index(later) < order.index(earlier):
            found.append(f"{name}: locks {later} after {earlier}, against the lock order")
    return found


def checked_migrations() -> list[Path]:
    return [
        p for p in sorted((ROOT / "migrations").glob("*.sql")) if int(p.name[:4]) >= FIRST_CHECKED
    ]


def test_lock_order_of_migrations_is_the_functions_order():
    """docs/architecture.md Conventions 15: the list names real tables, organizations first,
    and requests before their tasks, periods and notices ("Lock order")."""
    order = lock_order()
    assert order[:3] == ["llm.organizations", "llm.invocations", "llm.executions"]
    assert order.index("llm.period_stripes") < order.index("llm.threshold_notices")
    schema = (ROOT / "schema.sql").read_text(encoding="utf-8")
    assert all(f"CREATE TABLE {t} " in schema for t in order)


@pytest.mark.parametrize("path", checked_migrations(), ids=lambda p: p.stem)
def test_every_migration_from_0010_on_follows_the_rules(path):
    """docs/architecture.md Conventions 14 and 15 hold for each migration."""
    assert violations(path.stem, path.read_text(encoding="utf-8")) == []


GOOD = """-- transactional: false
LOCK TABLE llm.organizations IN SHARE MODE;
LOCK TABLE llm.invocations IN SHARE ROW EXCLUSIVE MODE;
ALTER TABLE llm.invocations ADD COLUMN note text, ADD COLUMN seen_at timestamptz;
ALTER TABLE llm.executions ADD CONSTRAINT executions_x CHECK (request_count >= 0) NOT VALID;
DROP INDEX CONCURRENTLY IF EXISTS llm.invocations_note;
CREATE INDEX CONCURRENTLY invocations_note ON llm.invocations (note);
ALTER TABLE llm.settings DROP CONSTRAINT settings_x;
-- bounded: the notices being sent (index threshold_notices_sending)
UPDATE llm.threshold_notices SET claim_token = NULL WHERE status = 'sending';
DO $$ BEGIN LOOP
    -- batched: 10000 rows a transaction
    UPDATE llm.invocations SET note = '' WHERE id IN (SELECT id FROM llm.invocations WHERE note IS NULL LIMIT 10000);
    EXIT WHEN NOT FOUND; COMMIT;
END LOOP; END $$;
"""


def test_a_migration_that_follows_the_rules_passes():
    """What the rules allow is not flagged."""
    assert violations("9999_good", GOOD) == []


@pytest.mark.parametrize(
    ("snippet", "caught"),
    [
        ("ALTER TABLE llm.invocations ADD COLUMN paid llm.amount;", "constrained column"),
        ("ALTER TABLE llm.executions ADD COLUMN n bigint NOT NULL DEFAULT 0;", "constrained column"),
        ("ALTER TABLE llm.daily_usage ADD COLUMN n bigint CHECK (n > 0);", "constrained column"),
        ("ALTER TABLE llm.invocations ADD note text, ADD paid bigint REFERENCES llm.organizations;",
         "constrained column"),
        ("CREATE INDEX invocations_x ON llm.invocations (model);", "without CONCURRENTLY"),
        ("CREATE INDEX CONCURRENTLY invocations_x ON llm.invocations (model);",
         "not marked -- transactional: false"),
        ("UPDATE llm.invocations SET note = '';", "of the whole table"),
        ("DELETE FROM llm.threshold_notices;", "of the whole table"),
        ("UPDATE llm.invocations SET note = '' WHERE note IS NULL;", "without a -- bounded:"),
        ("-- batched: 1000\nUPDATE llm.invocations SET note = '' WHERE id < 10;",
         "no batch is committed"),
        ("DROP TABLE llm.drift_findings;", "contract in the next release"),
        ("DROP VIEW llm.periods;", "contract in the next release"),
        ("ALTER TABLE llm.invocations DROP COLUMN recovered_credits;", "contract in the next release"),
        ("ALTER TABLE llm.executions RENAME COLUMN request_count TO requests;",
         "contract in the next release"),
        ("LOCK TABLE llm.threshold_notices IN SHARE MODE;\nLOCK TABLE llm.invocations IN SHARE MODE;",
         "against the lock order"),
        ("LOCK TABLE llm.period_stripes IN SHARE MODE;\nALTER TABLE llm.organizations ADD COLUMN x text;",
         "against the lock order"),
    ],
)  # fmt: skip
def test_each_rule_catches_its_bad_snippet(snippet, caught):
    """Each rule of Conventions 14 and 15 flags what it forbids."""
    found = violations("9999_bad", snippet)
    assert any(caught in v for v in found), found
