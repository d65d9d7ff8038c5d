"""The design documents are the source of truth the code cites (docs/architecture.md,
"Conventions" 13): docs/contract.md, docs/architecture.md,
docs/traceability.md and docs/decisions.md, indexed by docs/design.md.

No database: these tests read files only.

- every rule, capability, workflow, scenario or lifecycle id cited in tests/, sql/,
  migrations/, llm_db/ or the other docs is listed in traceability.md "The seeds' rules";
- every document a file cites (a path ending in .md) exists in the repository, no file
  cites a document outside it, every section of a design document a file names exists
  in that document, and every link to a section of one leads to a heading;
- every public routine of sql/ is listed in contract.md "Functions", every SQLSTATE the
  code raises or maps in contract.md "Errors", every invariant number check_invariants()
  returns in contract.md "Invariants", and every table and view of schema.sql in
  architecture.md "Schema".
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
# The design documents, by what a citation calls them; design.md is their index.
DESIGN_DOCS = ("contract", "architecture", "traceability", "decisions")
# The operator's pages, a job each; operations.md is their index, so a section cited
# there before 0.4.0 (in a landed migration, the CHANGELOG) is found through its table.
OPERATOR_DOCS = ("install", "upgrading", "pass", "monitoring", "tenants", "runbook")
CONTRACT = DOCS / "contract.md"
ARCHITECTURE = DOCS / "architecture.md"
TRACEABILITY = DOCS / "traceability.md"

# Landed migrations are never edited (docs/architecture.md "Conventions" 5), so what they
# cite stays as it was released.
LANDED = {"0001_schema.sql", "0002_domains.sql", "0003_hot_row_keys.sql"}

# The id forms of the seeds: BR-CAP-PFM-LLM-009-01, CAP-PFM-LLM-007, WF-PFM-LLM-004,
# STATE-PFM-LLM-002, SC-CAP-PFM-LLM-009-01, ACT-PFM-012, ... and the controls TC-AZ-001.
SEED_ID = re.compile(r"\b(?:[A-Z]+-)+PFM(?:-[A-Z]+)*(?:-[0-9]+)+\b|\bTC-[A-Z]+-[0-9]+\b")
# "BR-CAP-PFM-LLM-009-01/-03/-07" cites -01, -03 and -07
SHORTHAND = re.compile(r"\b((?:[A-Z]+-)+PFM(?:-[A-Z]+)*(?:-[0-9]+)*)-[0-9]+((?:/-[0-9]+)+)")

# A document: a relative or root-relative path ending in .md.
DOCUMENT = re.compile(r"(?<![\w.-])/?((?:\.{1,2}/)*[\w-]+(?:/[\w-]+)*\.md)(?!\w)")
# Documents kept outside the repository, which nothing may cite. Spelled in pieces so
# that this file does not cite them itself.
OUTSIDE = [
    "DESIGN" + ".md",
    "STYLE" + ".md",
    "seeds" + "/",
    "../" + "shared",
    "/work/" + "shared",
]
# docs/contract.md "Errors", docs/architecture.md, "Striped periods", and in docs/ the
# links [contract.md "Errors"](contract.md#errors): the document and the section it names.
SECTION_CITATION = re.compile(
    r"(?:docs/)?(design|contract|architecture|traceability|decisions|install|upgrading|pass|monitoring"
    r"|tenants|runbook)\.md\)?,?\s+\(?\"([^\"\n]+)\""
)
# A link to a section of a document in docs/: (contract.md#errors)
ANCHOR_LINK = re.compile(r"\]\(([a-z_]+\.md)#([a-z0-9_-]+)\)")

ROUTINE = re.compile(r"CREATE OR REPLACE (?:FUNCTION|PROCEDURE) llm\.([a-z][a-z0-9_]*)\s*\(")


def headings(text: str) -> set[str]:
    return {m.group(1).strip() for m in re.finditer(r"^#{2,4} (.+)$", text, re.MULTILINE)}


def anchor(title: str) -> str:
    """The anchor a Markdown renderer (GitHub's) gives a heading."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def section(path: Path, title: str) -> str:
    """The text under the level-2 heading ``title`` of ``path``, up to the next one."""
    text = path.read_text(encoding="utf-8")
    m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.MULTILINE | re.DOTALL)
    assert m, f"docs/{path.name} has no section ## {title}"
    return m.group(1)


def citing_files() -> list[Path]:
    """Every file of the repository that may cite an id, a document or a section."""
    found: list[Path] = []
    for folder, patterns in [
        ("sql", ["*.sql"]),
        ("migrations", ["*.sql"]),
        ("llm_db", ["**/*.py"]),
        ("tests", ["*.py"]),
        ("tests/isolation/specs", ["*.spec"]),
        ("scripts", ["*"]),
        ("benchmarks", ["**/*.py", "**/*.md", "**/*.sh"]),
        ("docs", ["*.md"]),
    ]:
        for pattern in patterns:
            found.extend(p for p in (ROOT / folder).glob(pattern) if p.is_file())
    found.extend(ROOT / name for name in ("README.md", "CHANGELOG.md", "schema.sql"))
    me = Path(__file__).resolve()
    return sorted(
        {p for p in found if p.resolve() != me and p.name not in LANDED and p.exists()}
    )


def cited_ids(text: str) -> set[str]:
    ids = set(SEED_ID.findall(text))
    for m in SHORTHAND.finditer(text):
        ids.update(f"{m.group(1)}{suffix}" for suffix in m.group(2).split("/") if suffix)
    return ids


def ids_by_file() -> dict[str, set[str]]:
    result = {}
    for path in citing_files():
        if path == TRACEABILITY:
            continue
        ids = cited_ids(path.read_text(encoding="utf-8"))
        if ids:
            result[str(path.relative_to(ROOT))] = ids
    return result


def test_every_id_cited_in_code_and_tests_is_listed_in_the_seeds_rules():
    listed = cited_ids(section(TRACEABILITY, "The seeds' rules"))
    by_file = ids_by_file()
    cited = set().union(*by_file.values())
    # the tests cite the rules they prove: an empty set means the pattern broke
    assert any(name.startswith("tests/") for name in by_file), "no id found in tests/"
    assert len(cited) >= 10, sorted(cited)
    missing = {
        name: sorted(ids - listed) for name, ids in sorted(by_file.items()) if ids - listed
    }
    assert not missing, f"ids cited but not listed in docs/traceability.md: {missing}"


def test_the_shorthand_of_several_rules_cites_each():
    assert cited_ids("BR-CAP-PFM-LLM-009-01/-03/-07 and WF-PFM-LLM-004 hop 2") == {
        "BR-CAP-PFM-LLM-009-01",
        "BR-CAP-PFM-LLM-009-03",
        "BR-CAP-PFM-LLM-009-07",
        "WF-PFM-LLM-004",
    }


def test_every_cited_document_is_in_the_repository():
    missing = []
    for path in citing_files():
        for m in DOCUMENT.finditer(path.read_text(encoding="utf-8")):
            target = m.group(1)
            # relative to the citing file, the repository, or docs/ (where documents live)
            if not any((base / target).exists() for base in (path.parent, ROOT, ROOT / "docs")):
                line = path.read_text(encoding="utf-8")[: m.start()].count("\n") + 1
                missing.append(f"{path.relative_to(ROOT)}:{line}: {target}")
    assert not missing, "cited documents that are not in the repository:\n" + "\n".join(missing)


def test_no_file_cites_a_document_outside_the_repository():
    found = []
    for path in citing_files():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for outside in OUTSIDE:
                if outside in line:
                    found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not found, "citations of documents outside the repository:\n" + "\n".join(found)


def test_every_cited_section_of_the_design_exists():
    titles = {doc: headings((DOCS / f"{doc}.md").read_text(encoding="utf-8"))
              for doc in (*DESIGN_DOCS, *OPERATOR_DOCS)}  # fmt: skip
    cited = []
    for path in citing_files():
        for m in SECTION_CITATION.finditer(path.read_text(encoding="utf-8")):
            cited.append((str(path.relative_to(ROOT)), m.group(1), m.group(2)))
    assert len(cited) >= 5, cited
    # design.md is only the index since 0.3.0: a section cited there moved to one of four
    # (the CHANGELOG's released entries keep citing what was true when they were written)
    moved = [
        f"{name}: docs/design.md {title!r}"
        for name, doc, title in cited
        if doc == "design" and name != "CHANGELOG.md"
    ]
    assert not moved, (
        "cite the document the section moved to (see docs/design.md's table):\n" + "\n".join(moved)
    )
    missing = [
        f"{name}: docs/{doc}.md {title!r}"
        for name, doc, title in cited
        if doc != "design" and title not in titles[doc]
    ]
    assert not missing, "cited sections that do not exist:\n" + "\n".join(missing)


def test_every_link_to_a_section_of_a_document_leads_to_a_heading():
    links = []
    for path in sorted(DOCS.glob("*.md")):
        for m in ANCHOR_LINK.finditer(path.read_text(encoding="utf-8")):
            links.append((path.name, m.group(1), m.group(2)))
    assert len(links) >= 10, links
    broken = []
    for name, target, wanted in links:
        target_path = DOCS / target
        anchors = (
            {anchor(title) for title in headings(target_path.read_text(encoding="utf-8"))}
            if target_path.exists()
            else set()
        )
        if wanted not in anchors:
            broken.append(f"docs/{name}: {target}#{wanted}")
    assert not broken, "links to sections that do not exist:\n" + "\n".join(broken)


def test_every_public_routine_is_listed_in_functions():
    functions = section(CONTRACT, "Functions")
    routines = set()
    for path in (ROOT / "sql").glob("*.sql"):
        routines.update(ROUTINE.findall(path.read_text(encoding="utf-8")))
    public = sorted(name for name in routines if not name.startswith("_"))
    assert len(public) >= 20, public
    missing = [name for name in public if f"`llm.{name}(" not in functions]
    assert not missing, f"public routines missing from docs/contract.md 'Functions': {missing}"


def test_every_sqlstate_raised_or_mapped_is_in_errors():
    errors = section(CONTRACT, "Errors")
    codes = set()
    for path in (ROOT / "sql").glob("*.sql"):
        codes.update(re.findall(r"ERRCODE = '([0-9A-Z]{5})'", path.read_text(encoding="utf-8")))
    mapped = (ROOT / "llm_db" / "errors.py").read_text(encoding="utf-8")
    codes.update(re.findall(r'^\s+code = "([0-9A-Z]{5})"', mapped, re.MULTILINE))
    assert {"LL001", "22023"} <= codes, sorted(codes)
    missing = sorted(code for code in codes if f"| {code} |" not in errors)
    assert not missing, f"SQLSTATEs missing from docs/contract.md 'Errors': {missing}"


def test_every_table_and_view_is_in_the_schema_section():
    schema = section(ARCHITECTURE, "Schema")
    snapshot = (ROOT / "schema.sql").read_text(encoding="utf-8")
    relations = set(re.findall(r"^CREATE (?:TABLE|VIEW) llm\.([a-z_]+)", snapshot, re.MULTILINE))
    assert {"invocations", "periods", "ledger"} <= relations, sorted(relations)
    missing = sorted(name for name in relations if f"`{name}`" not in schema)
    assert not missing, f"tables and views missing from docs/architecture.md 'Schema': {missing}"


def test_every_invariant_number_is_in_invariants():
    invariants = section(CONTRACT, "Invariants")
    sql = (ROOT / "sql" / "95_invariants.sql").read_text(encoding="utf-8")
    # one query per invariant in check_invariants() (0.2.0), or one llm._invariant_<N>()
    # each; 2b, 4b and 5b are reported under 2, 4 and 5
    numbers = set(re.findall(r"RETURN QUERY\s+SELECT ([0-9]+),", sql))
    numbers |= set(re.findall(r"FUNCTION llm\._invariant_([0-9]+)[a-z]?\s*\(", sql))
    assert len(numbers) >= 9, sorted(numbers)
    missing = sorted(
        (n for n in numbers if not re.search(rf"^{n}\. ", invariants, re.MULTILINE)), key=int
    )
    assert not missing, f"invariants missing from docs/contract.md 'Invariants': {missing}"
