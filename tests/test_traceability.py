"""docs/traceability.md tells the truth: every test file it names under
"tested in" exists and holds a test that cites the row's id, and every rule id of the seeds
(BR-CAP-PFM-LLM-009-01 to -07, SC-CAP-PFM-LLM-009-01) and every transition of
STATE-PFM-LLM-002 has a row naming at least one such file.

No database: these tests read files only.

A test cites an id in its docstring or in its name (``test_br_cap_pfm_llm_009_05_...``
cites BR-CAP-PFM-LLM-009-05); a module docstring is a claim about a file, not a test, so it
does not count. A transition's row is cited by a test citing STATE-PFM-LLM-002 and naming
both its states (``absent→running``, ``running_to_completed``).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRACEABILITY = ROOT / "docs" / "traceability.md"

SEED_ID = re.compile(r"\b(?:[A-Z]+-)+PFM(?:-[A-Z]+)*(?:-[0-9]+)+\b")
LIFECYCLE = "STATE-PFM-LLM-002"
TRANSITIONS_TABLE = f"Transitions of {LIFECYCLE}"
# What the seeds define and the table must map to tests: their rule ids, their scenario
# and the transitions of their lifecycle (docs/traceability.md says what each is).
SEED_RULES = {
    "BR-CAP-PFM-LLM-009-01",
    "BR-CAP-PFM-LLM-009-02",
    "BR-CAP-PFM-LLM-009-03",
    "BR-CAP-PFM-LLM-009-04",
    "BR-CAP-PFM-LLM-009-05",
    "BR-CAP-PFM-LLM-009-06",
    "BR-CAP-PFM-LLM-009-07",
    "SC-CAP-PFM-LLM-009-01",
}
SEED_TRANSITIONS = {
    ("absent", "running"),
    ("running", "completed"),
    ("running", "failed"),
    ("running", "abandoned"),
    ("completed", "completed"),
    ("completed", "running"),
    ("failed", "completed"),
    ("abandoned", "completed"),
    ("running", "running"),
}


@dataclass(frozen=True)
class Row:
    table: str
    first: str  # the row's first cell: an id (with a qualifier) or a transition
    tested_in: tuple[str, ...]

    @property
    def cited_id(self) -> str:
        if self.table == TRANSITIONS_TABLE:
            return LIFECYCLE
        found = SEED_ID.findall(self.first)
        return found[0] if found else ""

    @property
    def states(self) -> tuple[str, ...]:
        """The two states of a transition's row ("invalid completed → running"), else ()."""
        if self.table != TRANSITIONS_TABLE:
            return ()
        return tuple(re.findall(r"[a-z]+", self.first.removeprefix("invalid ")))


def rows(text: str) -> list[Row]:
    """The rows of every table under a ### heading whose last column is "tested in"."""
    found, table, columns = [], "", []
    for line in text.splitlines():
        if line.startswith("### "):
            table, columns = line[4:].strip(), []
        elif line.startswith("|") and not set(line) <= set("|-: "):
            cells = [cell.strip() for cell in line.strip().strip("|").split(" | ")]
            if not columns:
                columns = cells
            elif columns[-1] == "tested in":
                files = tuple(re.findall(r"`(test_[a-z0-9_]+\.py)`", cells[-1]))
                found.append(Row(table, cells[0], files))
    return found


def citations(path: Path) -> list[str]:
    """What each test function of ``path`` cites: its name, as an id, and its docstring."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [
        f"{node.name.replace('_', '-')} {ast.get_docstring(node) or ''}".lower()
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.name.startswith("test")
    ]


def cites(citation: str, row: Row) -> bool:
    return row.cited_id.lower() in citation and all(state in citation for state in row.states)


def uncited(text: str) -> list[str]:
    """Each (row, file) of the table whose file is missing or holds no test citing the row."""
    wrong = []
    for row in rows(text):
        for name in row.tested_in:
            path = ROOT / "tests" / name
            if not path.is_file():
                wrong.append(f"{row.first}: tests/{name} does not exist")
            elif not any(cites(citation, row) for citation in citations(path)):
                wrong.append(f"{row.first}: no test in tests/{name} cites {row.cited_id}")
    return wrong


def test_every_file_tested_in_holds_a_test_citing_the_rows_id():
    """The traceability table names, for each id, test files whose tests
    cite that id (BR-CAP-PFM-LLM-009-01 to -07, SC-CAP-PFM-LLM-009-01, the workflows'
    hops, the transitions of STATE-PFM-LLM-002)."""
    table = rows(TRACEABILITY.read_text(encoding="utf-8"))
    assert len(table) >= 40, f"the tables of docs/traceability.md were not read: {len(table)}"
    assert sum(len(row.tested_in) for row in table) >= 80
    wrong = uncited(TRACEABILITY.read_text(encoding="utf-8"))
    assert not wrong, "docs/traceability.md names tests that do not cite the id:\n" + "\n".join(
        wrong
    )


def test_every_seed_rule_scenario_and_transition_has_a_tested_row():
    """BR-CAP-PFM-LLM-009-01 to -07, SC-CAP-PFM-LLM-009-01 and every
    transition of STATE-PFM-LLM-002 (the seeds' list) have a row naming a test file."""
    table = rows(TRACEABILITY.read_text(encoding="utf-8"))
    tested_ids = {row.cited_id for row in table if row.tested_in and not row.states}
    tested_transitions = {row.states for row in table if row.tested_in and row.states}
    assert SEED_RULES - tested_ids == set()
    assert SEED_TRANSITIONS - tested_transitions == set()


def test_a_file_that_does_not_cite_the_id_is_reported():
    """The check can fail: a row naming a file whose tests cite other ids, a file that does
    not exist, and a transition whose states no test of the file names are each reported."""
    text = "\n".join(
        [
            "### Rules and the scenario of CAP-PFM-LLM-009",
            "",
            "| id | what it says | implemented in | tested in |",
            "|---|---|---|---|",
            "| BR-CAP-PFM-LLM-009-02 | a rule | x | `test_traceability.py`, `test_nothing.py` |",
            f"### {TRANSITIONS_TABLE}",
            "",
            "| transition | rule | implemented in | tested in |",
            "|---|---|---|---|",
            "| invalid failed → completed | a rule | x | `test_admission.py` |",
        ]
    )
    assert uncited(text) == [
        "BR-CAP-PFM-LLM-009-02: no test in tests/test_traceability.py cites BR-CAP-PFM-LLM-009-02",
        "BR-CAP-PFM-LLM-009-02: tests/test_nothing.py does not exist",
        "invalid failed → completed: no test in tests/test_admission.py cites STATE-PFM-LLM-002",
    ]
