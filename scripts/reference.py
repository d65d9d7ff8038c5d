"""Write docs/reference/: a page per public routine of schema ``llm``.

    .venv/bin/python scripts/reference.py            # a throw-away server of its own
    .venv/bin/python scripts/reference.py --dsn DSN  # a fresh migrated database, as its owner

Each page is generated, never edited by hand: the signature, parameters and result come
from the catalog of a migrated database, the description from the routine's COMMENT, the
roles from its grants, what each parameter means from scripts/reference_parameters.tsv, the
SQLSTATEs and their reasons from the routine's bullet in docs/contract.md "Functions" (a
code the bullet gives no reason for takes its meaning from "Errors"), the Python method
from the driver's table of operations (``codegen.operations``), and the example with its
output from running scripts/reference_examples.sql. It stops, naming them, on a parameter
without a meaning and on a 22023 without its reason. tests/test_reference.py fails when the
pages differ from what this script writes.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg.adapt import AdaptersMap
from psycopg.types.string import TextLoader

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the table is build-time code beside the package, not in it

from codegen.operations import operations  # noqa: E402

OUT = ROOT / "docs" / "reference"
EXAMPLES = ROOT / "scripts" / "reference_examples.sql"
PARAMETERS = ROOT / "scripts" / "reference_parameters.tsv"
CONTRACT = ROOT / "docs" / "contract.md"
# how a page in docs/reference/ links to it
CONTRACT_LINK = Path(os.path.relpath(CONTRACT, OUT)).as_posix()
COMMAND = ".venv/bin/python scripts/reference.py"
ROLES = ("llm_app", "llm_operator", "llm_reader")
# Raised inside the stripes' fast path and caught there: never leaves a routine.
INTERNAL = {"LL099"}
# Codes whose "Errors" row is the union of every routine's reasons: a routine's bullet
# must say which apply to it, or its page would list reasons that cannot.
NEEDS_REASON = {"22023"}
# A SQLSTATE in a contract bullet, and the parenthesis of its reason when one follows.
CODE = re.compile(r"\b(LL[0-9]{3}|[0-9]{2}[0-9A-Z][0-9]{2})\b( \()?")
# Where the example's output names the database or the role it ran as, the page says
# these instead, so the pages do not depend on where they were generated.
DATABASE, OWNER = "app", "owner"

ROUTINES = """
SELECT p.oid, p.proname AS name, p.prokind = 'p' AS procedure,
       pg_catalog.pg_get_function_arguments(p.oid) AS arguments,
       pg_catalog.pg_get_function_result(p.oid) AS result,
       coalesce(pg_catalog.obj_description(p.oid, 'pg_proc'), '') AS comment
FROM pg_catalog.pg_proc p
WHERE p.pronamespace = 'llm'::regnamespace AND p.proname !~ '^_'
ORDER BY p.proname
"""
# The body of every routine of the schema, private ones too, to follow the calls.
BODIES = """
SELECT p.proname AS name, p.prosrc AS body
FROM pg_catalog.pg_proc p WHERE p.pronamespace = 'llm'::regnamespace
"""
GRANTED = "SELECT pg_catalog.has_function_privilege(%s, %s::oid, 'EXECUTE')"


@dataclass(frozen=True)
class Routine:
    oid: int
    name: str
    procedure: bool
    arguments: str
    result: str | None
    comment: str


# ---------------------------------------------------------------- the catalog


def split_arguments(arguments: str) -> list[str]:
    """``pg_get_function_arguments`` split on the commas between arguments (not those
    inside a quoted default such as '{80,100}'::integer[] or inside parentheses)."""
    parts, depth, quoted, current = [], 0, False, ""
    for char in arguments:
        if char == "'":
            quoted = not quoted
        elif not quoted and char in "([":
            depth += 1
        elif not quoted and char in ")]":
            depth -= 1
        if char == "," and not quoted and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += char
    return [*parts, current.strip()] if current.strip() else parts


def code_of(body: str) -> str:
    """A routine's body without its comments and string literals: what it calls."""
    # one pass, so a quote inside a comment or "--" inside a string misleads neither
    return re.sub(r"'(?:[^']|'')*'|--[^\n]*", "", body)


def bodies(conn: psycopg.Connection) -> dict[str, str]:
    return dict(conn.execute(BODIES).fetchall())


def raised(name: str, bodies: dict[str, str]) -> set[str]:
    """The SQLSTATEs ``name`` and every routine it calls, directly or not, raise with
    RAISE ... ERRCODE (tests/test_reference.py holds the contract's lists to them)."""
    codes, seen, todo = set(), set(), [name]
    while todo:
        current = todo.pop()
        if current in seen or current not in bodies:
            continue
        seen.add(current)
        codes.update(re.findall(r"ERRCODE\s*=\s*'([0-9A-Z]{5})'", bodies[current]))
        todo.extend(re.findall(r"\bllm\.(\w+)\s*\(", code_of(bodies[current])))
    return codes - INTERNAL


def contract_section(title: str) -> str:
    text = CONTRACT.read_text(encoding="utf-8")
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def documented(name: str) -> dict[str, str | None]:
    """The SQLSTATEs docs/contract.md "Functions" lists for ``llm.<name>``, in code order,
    each with the reason in parentheses after it ("22023 (a bad scope)"), or None."""
    for entry in re.split(r"\n(?=- `llm\.)", contract_section("Functions")):
        if entry.startswith(f"- `llm.{name}("):
            words = " ".join(entry.split("\n\n")[0].split("`", 2)[2].split())  # after the signature
            reasons: dict[str, str | None] = {}
            at = 0
            while code := CODE.search(words, at):
                reason = reason_at(words, code.end()) if code.group(2) else None
                reasons[code.group(1)] = reason
                at = code.end() + len(reason or "")  # "1 to 10000" in a reason is no code
            return dict(sorted(reasons.items()))
    return {}


def reason_at(words: str, start: int) -> str:
    """The text from ``start`` to the parenthesis that closes the one just before it."""
    depth = 1
    for end in range(start, len(words)):
        depth += {"(": 1, ")": -1}.get(words[end], 0)
        if depth == 0:
            return words[start:end]
    raise SystemExit(f"{CONTRACT.name}: an unclosed parenthesis after {words[:start]!r}")


def errors_table() -> dict[str, tuple[str, str]]:
    """docs/contract.md "Errors": code -> (exception, meaning)."""
    text = contract_section("Errors")
    rows = re.findall(r"^\| ([0-9A-Z]{5}) \| ([^|]*) \| ([^\n]*) \|$", text, re.MULTILINE)
    return {code: (exception.strip(), meaning.strip()) for code, exception, meaning in rows}


# ---------------------------------------------------------------- the parameters


def meanings() -> dict[tuple[str, str], str]:
    """scripts/reference_parameters.tsv: (routine or "*", parameter) -> its meaning."""
    table = {}
    for line in PARAMETERS.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            routine, parameter, meaning = line.split("\t")
            table[routine, parameter] = meaning
    return table


def parameter_name(argument: str) -> str:
    """``p_scope text DEFAULT NULL::text`` -> ``p_scope`` (a procedure's may start IN)."""
    words = argument.split()
    return words[1] if words[0] in ("IN", "OUT", "INOUT") else words[0]


def meaning_of(routine: str, parameter: str, table: dict[tuple[str, str], str]) -> str | None:
    """The routine's own line for the parameter, else the shared one, else None."""
    return table.get((routine, parameter), table.get(("*", parameter)))


def unexplained(routines: list[Routine], table: dict[tuple[str, str], str]) -> list[str]:
    """Each parameter without a meaning, and each line of the table no routine uses."""
    wanted = {(r.name, parameter_name(a)) for r in routines for a in split_arguments(r.arguments)}
    used = {(r, p) if (r, p) in table else ("*", p) for r, p in wanted}
    return [
        f"llm.{r}({p}) has no meaning" for r, p in sorted(wanted) if not meaning_of(r, p, table)
    ] + [f"{r} {p} is no parameter of a public routine" for r, p in sorted(set(table) - used)]


def unreasoned(routines: list[Routine]) -> list[str]:
    """Each routine whose contract bullet lists a code of NEEDS_REASON without its reason."""
    return [
        f"llm.{r.name}: {code} has no reason in {CONTRACT.name}"
        for r in routines
        for code, reason in documented(r.name).items()
        if code in NEEDS_REASON and not reason
    ]


# ---------------------------------------------------------------- the examples


def examples() -> dict[str, list[str]]:
    """scripts/reference_examples.sql: the statements of each section, by its name, and
    its "-- note:" lines, which the page shows as comments before the statements."""
    sections: dict[str, list[str]] = {}
    current, statement = None, []
    for line in EXAMPLES.read_text(encoding="utf-8").splitlines():
        header = re.fullmatch(r"-- (setup|example: (\w+))", line)
        if header:
            current = header.group(2) or "setup"
            sections[current] = []
        elif current is not None and line.startswith("-- note: "):
            sections[current].append("-- " + line.removeprefix("-- note: "))
        elif current is not None and (line.strip() and not line.startswith("--")):
            statement.append(line)
            if line.endswith(";"):
                sections[current].append("\n".join(statement))
                statement = []
    return sections


def table(cursor: psycopg.Cursor) -> str:
    """The rows of the last statement as psql's aligned format prints them (left-aligned)."""
    if cursor.description is None:
        return cursor.statusmessage or ""
    names = [column.name for column in cursor.description]
    rows = [["" if value is None else str(value) for value in row] for row in cursor.fetchall()]
    widths = [max(len(cell) for cell in column) for column in zip(names, *rows, strict=False)]
    lines = [" | ".join(name.ljust(width) for name, width in zip(names, widths, strict=True))]
    lines.append("-+-".join("-" * width for width in widths))
    lines += [" | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    lines.append(f"({len(rows)} row{'' if len(rows) == 1 else 's'})")
    return "\n".join(line.rstrip() for line in lines)


def error(exc: psycopg.Error) -> str:
    diag = exc.diag
    lines = [f"ERROR:  {diag.sqlstate}: {diag.message_primary}"]
    lines += [
        f"{label}:  {value}"
        for label, value in [("DETAIL", diag.message_detail), ("HINT", diag.message_hint)]
        if value
    ]
    return "\n".join(lines)


def transcript(conn: psycopg.Connection, statements: list[str]) -> str:
    """Each statement and what it printed; an error ends the example."""
    parts = []
    with conn.cursor() as cursor:
        for statement in statements:
            parts.append(statement)
            if statement.startswith("--"):  # a note, shown as it is
                continue
            try:
                cursor.execute(statement)
            except psycopg.Error as exc:
                parts.append(error(exc))
                break
            parts.append(table(cursor))
    return "\n\n".join(parts)


@contextmanager
def rolled_back(conn: psycopg.Connection) -> Iterator[None]:
    conn.execute("BEGIN")
    try:
        yield
    finally:
        conn.execute("ROLLBACK")


def run_examples(conn: psycopg.Connection) -> dict[str, str]:
    """The transcript of each example: the setup committed, each example rolled back,
    the committing procedure last."""
    sections = examples()
    outputs = {}
    transcript(conn, sections.pop("setup"))
    committing = {n for n, lines in sections.items() if any(s.startswith("CALL ") for s in lines)}
    for name in sorted(sections, key=lambda n: (n in committing, n)):
        if name in committing:
            outputs[name] = transcript(conn, sections[name])
            continue
        with rolled_back(conn):
            outputs[name] = transcript(conn, sections[name])
    database, user = conn.execute("SELECT current_database(), current_user").fetchone()
    return {name: anonymous(text, database, user) for name, text in outputs.items()}


def anonymous(text: str, database: str, user: str) -> str:
    """``text`` with the database's and the role's names as the pages show them: each
    name only where it stands alone, so a database named llm leaves llm.settle_invocation
    and llm-reconciliation as they are."""
    for name, shown in ((database, DATABASE), (user, OWNER)):
        text = re.sub(rf"(?<![\w.-]){re.escape(name)}(?![\w.-])", shown, text)
    return text


# ---------------------------------------------------------------- the pages


def unquoted(signature: object) -> str:
    """A signature without the quotes postponed annotations put around each type."""
    return re.sub(r"(: |-> )'([^']*)'", r"\1\2", str(signature))


def python_methods(routine: str) -> list[str]:
    """The driver's methods that call ``routine``: ``Llm.<name><signature>`` and their
    documentation (``AsyncLlm`` has the same, as coroutines)."""
    return [
        f"```python\nLlm.{op.name}{unquoted(op.signature)}\n```\n\n{op.doc}"
        for op in operations().values()
        if op.routine == routine
    ]


def sqlstates(name: str) -> list[str]:
    """The table of the SQLSTATEs docs/contract.md documents for the routine, each with
    the routine's own reason, else the meaning of "Errors"."""
    codes = documented(name)
    if not codes:
        return ["None: it raises no error of its own."]
    errors = errors_table()
    lines = [
        f'As [contract.md "Functions"]({CONTRACT_LINK}#functions) lists them for this routine'
        f' (a code it gives no reason for: as ["Errors"]({CONTRACT_LINK}#errors) says):',
        "",
        "| code | exception | when |",
        "|---|---|---|",
    ]
    for code, reason in codes.items():
        exception, meaning = errors.get(code, ("", ""))
        lines.append(f"| {code} | {exception} | {reason or meaning} |")
    return lines


def parameters(routine: Routine, table: dict[tuple[str, str], str]) -> list[str]:
    """The table of the routine's parameters: name, type (and default), meaning."""
    arguments = split_arguments(routine.arguments)
    if not arguments:
        return ["None."]
    lines = ["| parameter | type | meaning |", "|---|---|---|"]
    for argument in arguments:
        name = parameter_name(argument)
        declared = argument.split(name, 1)[1].strip()
        lines.append(f"| `{name}` | `{declared}` | {meaning_of(routine.name, name, table)} |")
    return lines


def page(
    routine: Routine, roles: list[str], example: str, table: dict[tuple[str, str], str]
) -> str:
    kind = "PROCEDURE" if routine.procedure else "FUNCTION"
    returns = "" if routine.procedure else f"\nRETURNS {routine.result}"
    result = f"`{routine.result}`" if not routine.procedure else "None: a procedure, run by `CALL`."
    callers = ", ".join(f"`{role}`" for role in roles) or "No role"
    lines = [
        f"# llm.{routine.name}",
        "",
        f"<!-- generated by {COMMAND}: do not edit -->",
        "",
        routine.comment,
        "",
        "## Signature",
        "",
        f"```sql\n{kind} llm.{routine.name}({routine.arguments}){returns}\n```",
        "",
        "## Parameters",
        "",
        *parameters(routine, table),
        "",
        "## Result",
        "",
        result,
        "",
        "## Who may call it",
        "",
        f'{callers}, and the schema owner ([contract.md "Roles and grants"]'
        f"({CONTRACT_LINK}#roles-and-grants)).",
        "",
        "## SQLSTATEs",
        "",
        *sqlstates(routine.name),
        "",
        "## Python",
        "",
        *(python_methods(routine.name) or ["No driver method."]),
        "",
        "## Example",
        "",
        f"```sql\n{example}\n```",
        "",
    ]
    return "\n".join(lines)


def index(routines: list[Routine]) -> str:
    lines = [
        "# llm-db reference",
        "",
        f"<!-- generated by {COMMAND}: do not edit -->",
        "",
        "A page per public routine of schema `llm`: its signature, parameters, result,",
        "who may call it, the SQLSTATEs it raises, the Python method that calls it, and an",
        "example with its output. What the routines promise together is",
        f"[contract.md]({CONTRACT_LINK}).",
        "",
        "The examples are scripts/reference_examples.sql, run on a freshly migrated",
        "database as its owner. First its setup, committed: the organization `acme`",
        "(00...0a) with an allowance of 10000 credits, the task kind `summarize`, a day",
        "budget of 500 credits for project `search`, the request 00...01 of project",
        "`search` admitted at 2026-01-15 10:00 UTC and settled at 420 credits (past the",
        "budget's 80%: a notice is owed), and the request 00...02 of 30 credits admitted",
        "at 11:00 and left open. Then each example, in a transaction rolled back after",
        "it, so no example depends on another; `run_reconciliation`, which commits, last.",
        f"The database is shown as `{DATABASE}` and the role as `{OWNER}`.",
        "",
        "| routine | what it does |",
        "|---|---|",
    ]
    for routine in routines:
        first = re.split(r"(?<=[\w)]\.)\s", routine.comment, maxsplit=1)[0]
        lines.append(f"| [llm.{routine.name}]({routine.name}.md) | {first} |")
    return "\n".join(lines) + "\n"


def as_printed() -> AdaptersMap:
    """Adapters loading every value as the text PostgreSQL prints for it."""
    adapters = AdaptersMap()
    adapters.register_loader(0, TextLoader)  # oid 0: the loader of any type without one
    return adapters


def granted(conn: psycopg.Connection, routine: Routine) -> list[str]:
    return [role for role in ROLES if conn.execute(GRANTED, [role, routine.oid]).fetchone()[0]]


def render(dsn: str) -> dict[str, str]:
    """The pages, by file name, from the fresh migrated database at ``dsn``."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        routines = [Routine(*row) for row in conn.execute(ROUTINES).fetchall()]
        roles = {routine.name: granted(conn, routine) for routine in routines}
    options = "-c TimeZone=UTC -c DateStyle=ISO -c IntervalStyle=postgres"
    with psycopg.connect(dsn, autocommit=True, context=as_printed(), options=options) as conn:
        outputs = run_examples(conn)
    missing = sorted({r.name for r in routines} - set(outputs))
    if missing:
        raise SystemExit(f"{EXAMPLES.name} has no example for {missing}")
    table = meanings()
    unkept = unexplained(routines, table) + unreasoned(routines)
    if unkept:
        raise SystemExit(
            "\n".join([f"{PARAMETERS.name} and {CONTRACT.name} are not kept:", *unkept])
        )
    pages = {"README.md": index(routines)}
    for routine in routines:
        name = routine.name
        pages[f"{name}.md"] = page(routine, roles[name], outputs[name], table)
    return pages


def write(pages: dict[str, str], out: Path = OUT) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.md"):
        if old.name not in pages:
            old.unlink()
    for name, text in pages.items():
        (out / name).write_text(text, encoding="utf-8")


@contextmanager
def throwaway_database() -> Iterator[str]:
    """A fresh migrated database on a throw-away server, owned by a non-superuser."""
    from llm_db.testing import EphemeralServer, clone_database, create_template

    with EphemeralServer() as server:
        template = create_template(server)
        _, dsn = clone_database(server, template)
        yield dsn


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", help="a fresh migrated database (its examples are run in it)")
    args = parser.parse_args(argv)
    if args.dsn:
        write(render(args.dsn))
    else:
        with throwaway_database() as dsn:
            write(render(dsn))
    print(f"wrote {OUT.relative_to(ROOT)}/", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
