"""The files of sql/ read in dependency order. Each file calls only
routines it defines itself or an earlier file (in name order, the order `llm-db
migrate` applies them) defines, so a reader tracing a call never has to look ahead.
The pass (65_pass.sql), which orchestrates every capability, is the one documented
exception. A routine is defined by one file only.

How the calls are read. A file is read as code: its comments and string literals are
blanked (a HINT of 10_common.sql names llm.upsert_organization(...) and calls
nothing), while routine bodies (dollar-quoted after AS or DO, or BEGIN ATOMIC ... END)
stay code. A call is the name of a routine sql/ defines followed by "(", written
llm.name, "llm"."name", or name alone, since the bodies run with llm on their
search_path; a name qualified by another schema is not one of ours. Every statement
is read but those that name routines without running them: COMMENT ON, GRANT,
REVOKE, and DROP or ALTER of a FUNCTION, PROCEDURE or ROUTINE. In a CREATE FUNCTION
or PROCEDURE only the name being created is skipped: the DEFAULT expressions of its
parameters and its body are calls made by that routine.

Known limit: a call built as a string and run by EXECUTE cannot be read as a call.
test_dynamic_sql_names_no_routine_but_the_cron_job lists the routines named in the
strings sql/ runs with EXECUTE (one today, checked by hand). Routines reached through
a variable (98_search_path.sql's ALTER, 97_distribute.sql's distribution) are named,
not called."""

from __future__ import annotations

import bisect
import functools
import re
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
SQL_DIR = ROOT / "sql"

# The files whose routines may call routines defined in later files. Only the pass:
# it orchestrates every capability, so it runs one defined after it
# (rebuild_daily_usage, in 80_reporting.sql). Keep this set minimal.
MAY_CALL_FORWARD = {"65_pass.sql"}

DOLLAR_TAG = re.compile(r"\$(?:[A-Za-z_][A-Za-z_0-9]*)?\$")
# an identifier, quoted ("llm", case kept) or not (folded to lower case)
IDENT = r'(?:"(?:[^"]|"")+"|[A-Za-z_][A-Za-z_0-9$]*)'
DEFINITION = re.compile(
    rf"\s*CREATE\s+(?:OR\s+REPLACE\s+)?(?:FUNCTION|PROCEDURE)\s+"
    rf"(?P<schema>{IDENT})\s*\.\s*(?P<name>{IDENT})\s*\(",
    re.I,
)
# A name followed by "(", with or without a schema; never the tail of a longer
# qualified name (a.b.c), whose a would be a database or a table.
CALL = re.compile(rf"(?<![\w$.\"])(?:(?P<schema>{IDENT})\s*\.\s*)?(?P<name>{IDENT})\s*\(")
# the statements that name routines without running them
NAMING_STATEMENT = re.compile(
    r"\s*(?:COMMENT\s+ON|GRANT|REVOKE|(?:DROP|ALTER)\s+(?:FUNCTION|PROCEDURE|ROUTINE))\b",
    re.I,
)
CREATE_ROUTINE = re.compile(r"\s*CREATE\s+(?:OR\s+REPLACE\s+)?(?:FUNCTION|PROCEDURE)\b", re.I)
DO_BLOCK = re.compile(r"\s*DO\b", re.I)
ATOMIC = re.compile(r"\bBEGIN\s+ATOMIC\b", re.I)
# the words of code, a quoted identifier being one word ("end" is no END)
WORD = re.compile(r'"(?:[^"]|"")*"|[A-Za-z_][A-Za-z_0-9$]*')
# PL/pgSQL's EXECUTE of a string (not GRANT EXECUTE, nor a trigger's EXECUTE FUNCTION)
DYNAMIC_SQL = re.compile(r"(?P<before>\w*)\s+EXECUTE\b(?!\s+(?:FUNCTION|PROCEDURE)\b)", re.I)
STATEMENT_END = re.compile(r";|\bLOOP\b", re.I)


def ident(written: str) -> str:
    """The name an identifier stands for: quoted as written, else in lower case."""
    if written.startswith('"'):
        return written[1:-1].replace('""', '"')
    return written.lower()


class Code(NamedTuple):
    text: str  # the file with comments and strings blanked, lines kept
    bodies: list[tuple[int, int]]  # spans of routine bodies (dollar-quoted or ATOMIC)
    strings: list[tuple[int, int]]  # spans of the string literals blanked


def _blank(text: str) -> str:
    """Spaces for everything but the line breaks, so offsets and lines stay."""
    return re.sub(r"[^\n]", " ", text)


def _inside(at: int, spans: list[tuple[int, int]]) -> bool:
    return any(a <= at < b for a, b in spans)


def strip(text: str) -> Code:
    """``text`` with its comments ("--" and nested "/* */") and string literals ('...',
    E'...', and dollar-quoted strings) blanked; quoted identifiers stay. A
    dollar-quoted block that follows AS or DO is a body: it stays code and its span
    is recorded, as is the span of each BEGIN ATOMIC ... END body."""
    out: list[str] = []
    bodies: list[tuple[int, int]] = []
    strings: list[tuple[int, int]] = []
    open_body: tuple[str, int] | None = None  # (tag, start) of the body we are in
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("--", i):
            end = text.find("\n", i)
            end = n if end < 0 else end
        elif text.startswith("/*", i):
            depth, end = 1, i + 2
            while depth and end < n:
                if text.startswith("/*", end):
                    depth, end = depth + 1, end + 2
                elif text.startswith("*/", end):
                    depth, end = depth - 1, end + 2
                else:
                    end += 1
        elif c == '"':  # a quoted identifier: code, but no quote or comment opens in it
            end = i + 1
            while (end := text.find('"', end) + 1) and text.startswith('"', end):
                end += 1
            end = end or n
            out.append(text[i:end])
            i = end
            continue
        elif c == "'":
            escapes = text[i - 1 : i] in ("e", "E") and not text[i - 2 : i - 1].isalnum()
            end = i + 1
            while end < n:
                if escapes and text[end] == "\\":
                    end += 2
                elif text[end] == "'":
                    if text.startswith("''", end):
                        end += 2
                    else:
                        end += 1
                        break
                else:
                    end += 1
            strings.append((i, end))
        elif c == "$" and (tag := DOLLAR_TAG.match(text, i)) and not text[i - 1 : i].isalnum():
            tag_text = tag.group()
            if open_body and tag_text == open_body[0]:
                bodies.append((open_body[1], tag.end()))
                open_body = None
                out.append(tag_text)
                i = tag.end()
                continue
            before = "".join(out).rstrip()
            if open_body is None and re.search(r"\b(?:AS|DO)$", before, re.I):
                open_body = (tag_text, i)
                out.append(tag_text)
                i = tag.end()
                continue
            close = text.find(tag_text, tag.end())
            end = n if close < 0 else close + len(tag_text)
            strings.append((i, end))
        else:
            out.append(c)
            i += 1
            continue
        out.append(_blank(text[i:end]))
        i = end
    assert open_body is None, f"a body opened by {open_body[0]} is never closed"
    code = "".join(out)
    return Code(code, sorted(bodies + _atomic_bodies(code, bodies)), strings)


def _atomic_bodies(code: str, bodies: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The spans of the SQL-standard bodies, BEGIN ATOMIC to its END: each CASE in
    between opens an END of its own (psql splits statements the same way)."""
    found = []
    for m in ATOMIC.finditer(code):
        if _inside(m.start(), bodies):
            continue
        depth = 1
        for word in WORD.finditer(code, m.end()):
            depth += {"CASE": 1, "END": -1}.get(word.group().upper(), 0)
            if depth == 0:
                found.append((m.start(), word.end()))
                break
        else:
            raise AssertionError(f"BEGIN ATOMIC at offset {m.start()} has no END")
    return found


def statements(code: Code) -> Iterator[tuple[int, int]]:
    """The spans of the file's statements: it splits at each ";" outside a body."""
    start = 0
    for m in re.finditer(";", code.text):
        if not _inside(m.start(), code.bodies):
            yield start, m.end()
            start = m.end()
    if code.text[start:].strip():
        yield start, len(code.text)


class Call(NamedTuple):
    file: str
    line: int
    caller: str
    callee: str


def find_calls(files: dict[str, str]) -> tuple[dict[str, list[str]], list[Call]]:
    """Which files define each routine, and every call in ``files`` (name -> text) to a
    routine they define."""
    defined: dict[str, list[str]] = {}
    parsed = []
    for file, text in sorted(files.items()):
        code = strip(text)
        created = {}  # statement start -> (offset, name) of the routine it creates
        for start, _ in statements(code):
            if (d := DEFINITION.match(code.text, start)) and ident(d["schema"]) == "llm":
                created[start] = (d.start("name"), ident(d["name"]))
                defined.setdefault(ident(d["name"]), []).append(file)
        parsed.append((file, code, created))
    calls = []
    for file, code, created in parsed:
        for start, end in statements(code):
            if NAMING_STATEMENT.match(code.text, start):
                continue
            own = created.get(start)
            caller = f"llm.{own[1]}" if own else "(top level)"
            if not own and DO_BLOCK.match(code.text, start):
                caller = "(DO block)"
            for m in CALL.finditer(code.text, start, end):
                callee = ident(m["name"])
                if (
                    callee in defined
                    and (m["schema"] is None or ident(m["schema"]) == "llm")
                    and not (own and m.start("name") == own[0])
                ):
                    line = code.text.count("\n", 0, m.start()) + 1
                    calls.append(Call(file, line, caller, callee))
    return defined, calls


@functools.cache
def sql_files() -> dict[str, str]:
    return {p.name: p.read_text(encoding="utf-8") for p in SQL_DIR.glob("*.sql")}


@functools.cache
def read_sql() -> tuple[dict[str, list[str]], list[Call]]:
    """Which files define each routine, and every call in sql/ to a routine sql/ defines."""
    return find_calls(sql_files())


def forward_calls(defined: dict[str, list[str]], calls: list[Call]) -> list[str]:
    return [
        f"{c.file}:{c.line}: {c.caller} calls llm.{c.callee}, defined later in {defined[c.callee][0]}"
        for c in calls
        if c.file not in MAY_CALL_FORWARD and defined[c.callee][0] > c.file
    ]


def test_each_sql_file_calls_only_itself_and_earlier_files():
    """No routine of sql/ calls a routine defined in a later file, but
    the pass's (65_pass.sql, the documented exception)."""
    defined, calls = read_sql()
    assert calls, "no call found in sql/: the parser reads nothing"
    forward = forward_calls(defined, calls)
    assert not forward, "calls to later files:\n" + "\n".join(forward)


def test_each_routine_is_defined_by_one_file():
    """A routine has one home, so "which file holds it" has one answer
    and the name order alone decides what a file may call."""
    defined, _ = read_sql()
    twice = [
        f"llm.{name}: {', '.join(files)}" for name, files in defined.items() if len(set(files)) > 1
    ]
    assert not twice, "routines defined by two files:\n" + "\n".join(twice)


def test_each_routine_is_created_under_its_qualified_name():
    """The parser knows a routine by its CREATE llm.name (...), so a
    routine created without the schema, or in another, would escape the order check."""
    elsewhere = []
    for file, text in sorted(sql_files().items()):
        code = strip(text)
        for start, _ in statements(code):
            d = DEFINITION.match(code.text, start)
            c = CREATE_ROUTINE.match(code.text, start)
            if c and not (d and ident(d["schema"]) == "llm"):
                line = code.text.count("\n", 0, c.end()) + 1
                elsewhere.append(f"{file}:{line}")
    assert not elsewhere, "routines created outside llm., or unqualified:\n" + "\n".join(elsewhere)


def test_the_exception_is_used():
    """The allow-list stays minimal. The pass does call forward (else it
    would not need to be listed), and every file listed exists."""
    defined, calls = read_sql()
    for file in MAY_CALL_FORWARD:
        assert (SQL_DIR / file).is_file(), file
        assert any(c.file == file and defined[c.callee][0] > file for c in calls), file


def _words_of_literal(literal: str) -> Iterator[str]:
    """The names a string literal holds as SQL, its own comments and strings aside."""
    quote = "'" if literal.startswith("'") else DOLLAR_TAG.match(literal).group()
    inner = literal[len(quote) : -len(quote)].replace("''", "'")
    return (ident(word.group()) for word in WORD.finditer(strip(inner).text))


def executed_strings_naming_routines(
    files: dict[str, str], defined: dict[str, list[str]]
) -> list[Call]:
    """Each name of a routine of ``defined`` found in a string that a body of ``files``
    runs with EXECUTE (the statement from EXECUTE to its ";" or LOOP): the calls the
    parser cannot place, with the caller "EXECUTE"."""
    named = []
    for file, text in sorted(files.items()):
        code = strip(text)
        for m in DYNAMIC_SQL.finditer(code.text):
            if m["before"].upper() in ("GRANT", "REVOKE") or not _inside(m.start(), code.bodies):
                continue
            end = STATEMENT_END.search(code.text, m.end())
            stop = end.start() if end else len(text)
            for a, b in code.strings[bisect.bisect(code.strings, (m.end(),)) :]:
                if a >= stop:
                    break
                line = text.count("\n", 0, a) + 1
                named += [
                    Call(file, line, "EXECUTE", w)
                    for w in _words_of_literal(text[a:b])
                    if w in defined
                ]
    return named


def test_dynamic_sql_names_no_routine_but_the_cron_job():
    """The parser's known limit: a call built as a string and run by
    EXECUTE is invisible to it, so the strings sql/ runs with EXECUTE name one routine
    of ours only: the pass in the command of the pg_cron job 90_schedule.sql creates,
    defined earlier (65_pass.sql). The others run cron's and Citus's routines, or DROP
    and ALTER routines held in a variable."""
    defined, _ = read_sql()
    named = executed_strings_naming_routines(sql_files(), defined)
    assert {(c.file, c.callee) for c in named} == {("90_schedule.sql", "run_reconciliation")}
    assert not forward_calls(defined, named)


def test_no_routine_name_names_anything_else():
    """A routine's name alone before "(" counts as a call, which is
    right only while no table, column, type, variable, CTE or alias shares a routine's
    name (one would show before "(" in INSERT INTO name (...) or WITH name(a) AS).
    Such a name shows somewhere without "(", so: in the code of sql/ and migrations/,
    a routine's name is followed by "(", or by "." when a body qualifies its own
    variables with it (_begin_run.run_id)."""
    defined, _ = read_sql()
    paths = sorted(SQL_DIR.glob("*.sql")) + sorted((ROOT / "migrations").glob("*.sql"))
    assert len(paths) > len(list(SQL_DIR.glob("*.sql"))), "migrations/ is read too"
    misused = []
    for path in paths:
        code = strip(path.read_text(encoding="utf-8")).text
        for word in WORD.finditer(code):
            if ident(word.group()) in defined and not re.match(r"\s*[(.]", code[word.end() :]):
                line = code.count("\n", 0, word.start()) + 1
                misused.append(f"{path.relative_to(ROOT)}:{line}: {word.group()}")
    assert not misused, "routine names used for something else:\n" + "\n".join(misused)


def calls_in(text: str, earlier: str = "") -> list[tuple[str, str]]:
    """(caller, callee) of each call read in ``text``, as file 20_b.sql after ``earlier``
    as 10_a.sql; the callees are routines either defines."""
    _, calls = find_calls({"10_a.sql": earlier, "20_b.sql": text})
    return [(c.caller, c.callee) for c in calls if c.file == "20_b.sql"]


G = "CREATE FUNCTION llm._g(p int = 0) RETURNS int LANGUAGE sql AS $$ SELECT p $$;\n"


def test_the_parser_skips_comments_and_strings_but_reads_bodies():
    """The parser counts calls in routine bodies, and not the names in a
    comment, a string (as 10_common.sql's HINT naming llm.upsert_organization), an E''
    string or a dollar-quoted string that is no body."""
    text = (
        "-- llm.a(1)\n/* llm.b( /* nested */ llm.c() */\n"
        "CREATE OR REPLACE FUNCTION llm.f() RETURNS void LANGUAGE plpgsql AS $$\n"
        "BEGIN RAISE USING HINT = 'see llm.d(x) and ''llm.e()''';\n"
        "  PERFORM pg_catalog.format($q$ llm.g() $q$, E'\\' llm.h()');\n"
        "  PERFORM llm.real_call(1);\nEND $$;\nCOMMENT ON FUNCTION llm.f() IS 'llm.i()';\n"
    )
    code = strip(text)
    assert len(code.text) == len(text) and code.text.count("\n") == text.count("\n")
    named = [m["name"] for m in CALL.finditer(code.text) if m["schema"] == "llm"]
    assert named == ["f", "real_call", "f"]
    assert len(code.bodies) == 1 and code.text[code.bodies[0][0] :].startswith("$$")
    routines = "".join(
        f"CREATE FUNCTION llm.{x}() RETURNS int LANGUAGE sql RETURN 1;\n" for x in "abcdeghi"
    )
    assert calls_in(
        text + "CREATE FUNCTION llm.real_call(int) RETURNS int RETURN 1;", routines
    ) == [("llm.f", "real_call")]


def test_the_parser_reads_unqualified_and_quoted_calls():
    """Bodies run with llm on their search_path, so _g(...) calls
    llm._g; "llm"."_g"(...) and LLM . _G (...) too. pg_catalog._g(...) is another
    schema's routine, and a variable or column named _g is no call."""
    text = (
        "CREATE FUNCTION llm.f() RETURNS int LANGUAGE plpgsql AS $$\n"
        "DECLARE _g int := 1;\nBEGIN\n"
        '  PERFORM _g(1); PERFORM "llm"."_g"(2); PERFORM LLM . _G (3);\n'
        '  PERFORM pg_catalog._g(4), "_G"(5);\n'
        "  SELECT t._g INTO _g FROM llm.t AS t WHERE t._g = _g;\n"
        "  RETURN _g;\nEND $$;\n"
    )
    assert calls_in(text, G) == [("llm.f", "_g")] * 3


def test_the_parser_reads_calls_in_table_statements():
    """ALTER TABLE ... SET DEFAULT llm._g() and ADD CHECK (llm._g(...))
    run the routine: they count. COMMENT ON, GRANT, REVOKE, DROP and ALTER FUNCTION only
    name it."""
    text = (
        "ALTER TABLE llm.t ALTER COLUMN c SET DEFAULT llm._g();\n"
        "ALTER TABLE llm.t ADD CHECK (llm._g(c) > 0);\n"
        "CREATE TABLE llm.u (c int DEFAULT _g());\n"
        "COMMENT ON FUNCTION llm._g(int) IS 'x';\n"
        "GRANT EXECUTE ON FUNCTION llm._g(int) TO r;\n"
        "REVOKE ALL ON FUNCTION llm._g(int) FROM PUBLIC;\n"
        'DROP FUNCTION IF EXISTS llm._g(int), "llm"._g(text);\n'
        "ALTER FUNCTION llm._g(int) OWNER TO r;\n"
    )
    assert calls_in(text, G) == [("(top level)", "_g")] * 3


def test_the_parser_reads_parameter_defaults():
    """A parameter's DEFAULT in a CREATE FUNCTION header is a call made
    by the routine being created; its own name is not."""
    text = (
        "CREATE OR REPLACE FUNCTION llm.f(p_a int DEFAULT llm._g(), p_b int = _g(1))\n"
        "RETURNS int LANGUAGE sql AS $$ SELECT p_a + p_b $$;\n"
    )
    assert calls_in(text, G) == [("llm.f", "_g")] * 2


def test_the_parser_reads_begin_atomic_bodies():
    """A SQL-standard body (BEGIN ATOMIC ... END, with a CASE ... END
    inside) or RETURN expression belongs to its routine; the routines after it keep
    their own calls."""
    text = (
        "CREATE FUNCTION llm.f(p int) RETURNS int LANGUAGE sql\nBEGIN ATOMIC\n"
        "  SELECT CASE WHEN p > 0 THEN llm._g(p) END;\n  SELECT _g(2);\nEND;\n"
        "CREATE FUNCTION llm.h() RETURNS int LANGUAGE plpgsql AS $$\n"
        "BEGIN RETURN llm._g(3); END $$;\n"
        "CREATE FUNCTION llm.k() RETURNS int LANGUAGE sql RETURN llm._g(4);\n"
    )
    assert calls_in(text, G) == [("llm.f", "_g")] * 2 + [("llm.h", "_g"), ("llm.k", "_g")]


def test_the_parser_reads_what_execute_runs():
    """The known limit: the names in a string run by EXECUTE are found
    (here in the format string or its argument), not those in a string's comment, in
    GRANT EXECUTE or in a trigger's EXECUTE FUNCTION."""
    text = (
        "CREATE FUNCTION llm.f() RETURNS void LANGUAGE plpgsql AS $$\nBEGIN\n"
        "  EXECUTE pg_catalog.format('SELECT llm._g(%s)', 1);\n"
        "  FOR r IN EXECUTE pg_catalog.format($q$ SELECT %I() -- _g\n $q$, '_g') LOOP\n"
        "    RAISE NOTICE '_g';\n  END LOOP;\n"
        "  EXECUTE 'SELECT 1';\n  GRANT EXECUTE ON FUNCTION llm._g(int) TO r;\nEND $$;\n"
        "CREATE TRIGGER t AFTER INSERT ON llm.t EXECUTE FUNCTION llm._g();\n"
    )
    files = {"10_a.sql": G, "20_b.sql": text}
    named = executed_strings_naming_routines(files, find_calls(files)[0])
    assert [(c.line, c.callee) for c in named] == [(3, "_g"), (5, "_g")]
