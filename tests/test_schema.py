"""The schema as it is now, in one file: ``schema.sql`` at the repository root is a
normalized schema-only dump (``pg_dump --schema-only --schema=llm --no-owner``) of a
database migrated from ``migrations/`` and ``sql/``. This test fails when the two differ,
so every schema or routine change shows up in review as a diff of ``schema.sql``.

Normalized: what depends on the server version or the moment goes, and each routine's
body becomes its md5 digest. A body lives once, in ``sql/``; the snapshot still changes
with it, and shows every routine's signature, settings, comment and grants.

After a deliberate change, rewrite the snapshot and commit it:

    LLM_DB_WRITE_SCHEMA=1 bash scripts/test.sh tests/test_schema.py

That run still fails when it rewrote the file ("schema.sql rewritten"), so a CI job
that sets the variable by mistake cannot pass over a stale snapshot; run it again
(with or without the variable) and it passes.
"""

from __future__ import annotations

import difflib
import hashlib
import os
import re
import subprocess
from pathlib import Path

from llm_db.testing._server import BIN_DIR

ROOT = Path(__file__).resolve().parents[1]
SNAPSHOT = ROOT / "schema.sql"
HEADER = """\
-- llm-db: the schema as migrations/ and sql/ build it (schema llm; owners left out).
-- Generated, never edited: LLM_DB_WRITE_SCHEMA=1 bash scripts/test.sh tests/test_schema.py
-- tests/test_schema.py fails when this file and a fresh migrate differ.
"""

# pg_dump lines that depend on the server, the client or the moment, not on the schema
_NOISE = re.compile(r"^(--.*|\\(un)?restrict .*|SET .*|SELECT pg_catalog\.set_config\(.*)$")
# a routine body as pg_dump quotes it: AS $$ ... $$ (or $_$ ... $_$ when it holds $$)
_BODY = re.compile(r"AS (\$\w*\$)(.*?)\1", re.DOTALL)


def _digest(match: re.Match[str]) -> str:
    quote, body = match.group(1), match.group(2)
    return f"AS {quote} body in sql/, md5 {hashlib.md5(body.encode()).hexdigest()} {quote}"


def normalized_dump(dsn: str) -> str:
    dump = subprocess.run(
        [str(BIN_DIR / "pg_dump"), "--schema-only", "--schema=llm", "--no-owner", dsn],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    lines = [line.rstrip() for line in dump.splitlines() if not _NOISE.match(line)]
    text = _BODY.sub(_digest, "\n".join(lines))
    text = re.sub(r"\n{3,}", "\n\n", text).strip()
    return HEADER + "\n" + text + "\n"


def test_schema_sql_is_what_migrate_builds(llm_dsn):
    """A fresh migrate (the template every test clones) dumps to exactly ``schema.sql``;
    with LLM_DB_WRITE_SCHEMA=1 a differing snapshot is rewritten and the test still
    fails, naming the diff (no setting makes it pass unchecked)."""
    current = normalized_dump(llm_dsn)
    recorded = SNAPSHOT.read_text() if SNAPSHOT.exists() else ""
    diff = "".join(
        difflib.unified_diff(
            recorded.splitlines(keepends=True), current.splitlines(keepends=True),
            "schema.sql (committed)", "schema.sql (migrate now)", n=2,
        )  # fmt: skip
    )
    if diff and os.environ.get("LLM_DB_WRITE_SCHEMA") == "1":
        SNAPSHOT.write_text(current)
        raise AssertionError("schema.sql rewritten; review the diff and commit it:\n" + diff[:6000])
    assert not diff, (
        "schema.sql differs from what migrate builds; if the change is meant, run\n"
        "  LLM_DB_WRITE_SCHEMA=1 bash scripts/test.sh tests/test_schema.py\n"
        "and commit schema.sql.\n" + diff[:6000]
    )
