"""issue 24 item 1: the files of sql/ read in dependency order. Each file calls only
routines it defines itself or an earlier file (in name order, the order `llm-db
migrate` applies them) defines, so a reader tracing a call never has to look ahead.
The pass (65_pass.sql), which orchestrates every capability, is the one documented
exception. A routine is defined by one file only.

The calls are read from the code, not from its comments and strings: a HINT of
10_common.sql names llm.upsert_organization(...) and calls nothing."""

from __future__ import annotations

import re
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
SQL_DIR = ROOT / "sql"

# The files whose routines may call forward: the pass orchestrates every capability,
# one after it too (the daily usage rebuild of 80_reporting.sql). Keep this minimal.
MAY_CALL_FORWARD = {"65_pass.sql"}

DOLLAR_TAG = re.compile(r"\$(?:[A-Za-z_][A-Za-z_0-9]*)?\$")
DEFINITION = re.compile(
    r"\bCREATE\s+(?:OR\s+REPLACE\s+)?(?:FUNCTION|PROCEDURE)\s+llm\.(\w+)\s*\(", re.I
)
# A routine's name followed by "(": a call, unless a statement that names routines
# without running them holds it (its definition, COMMENT ON, GRANT, REVOKE, ...).
NAMED = re.compile(r"\bllm\.(\w+)\s*\(")
NAMING_STATEMENT = re.compile(
    r"\s*(?:CREATE\s+(?:OR\s+REPLACE\s+)?(?:FUNCTION|PROCEDURE)|COMMENT|GRANT|REVOKE|DROP|ALTER)\b",
    re.I,
)


class Code(NamedTuple):
    text: str  # the file with comments and strings blanked, lines kept
    bodies: list[tuple[int, int]]  # spans of routine bodies and DO blocks


def _blank(text: str) -> str:
    """Spaces for everything but the line breaks, so offsets and lines stay."""
    return re.sub(r"[^\n]", " ", text)


def strip(text: str) -> Code:
    """``text`` with its comments ("--" and nested "/* */") and string literals ('...',
    E'...', and dollar-quoted strings) blanked. A dollar-quoted block that follows AS
    or DO is a body: it stays code and its span is recorded."""
    out: list[str] = []
    bodies: list[tuple[int, int]] = []
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
        else:
            out.append(c)
            i += 1
            continue
        out.append(_blank(text[i:end]))
        i = end
    assert open_body is None, f"a body opened by {open_body[0]} is never closed"
    return Code("".join(out), bodies)


class Call(NamedTuple):
    file: str
    line: int
    caller: str
    callee: str


def statement_start(code: Code, at: int) -> int:
    """Where the statement holding offset ``at`` begins: after the last ";" before it
    that is not inside a body ``at`` is not in, or where its body begins."""
    body = next((a for a, b in code.bodies if a <= at < b), None)
    floor = 0 if body is None else code.text.index("$", body + 1) + 1
    i = at
    while (i := code.text.rfind(";", floor, i)) >= 0:
        if body is not None or not any(a <= i < b for a, b in code.bodies):
            return i + 1
    return floor


def read_sql() -> tuple[dict[str, list[str]], list[Call]]:
    """Which files define each routine, and every call in sql/ to a routine sql/ defines."""
    defined: dict[str, list[str]] = {}
    found: list[tuple[str, Code, list[tuple[int, str]]]] = []
    for path in sorted(SQL_DIR.glob("*.sql"), key=lambda p: p.name):
        code = strip(path.read_text(encoding="utf-8"))
        starts = [(m.start(), m.group(1)) for m in DEFINITION.finditer(code.text)]
        for _, name in starts:
            defined.setdefault(name, []).append(path.name)
        found.append((path.name, code, starts))
    calls = []
    for file, code, starts in found:
        # each routine's body is the first one after its CREATE; other bodies are DO blocks
        owner = {
            next(b for b in code.bodies if b[0] > start): f"llm.{name}" for start, name in starts
        }
        for m in NAMED.finditer(code.text):
            at, callee = m.start(), m.group(1)
            if callee not in defined or NAMING_STATEMENT.match(
                code.text, statement_start(code, at)
            ):
                continue  # a table, a type, or a routine named but not run
            body = next((b for b in code.bodies if b[0] <= at < b[1]), None)
            caller = "(top level)" if body is None else owner.get(body, "(DO block)")
            calls.append(Call(file, code.text.count("\n", 0, at) + 1, caller, callee))
    return defined, calls


def forward_calls(defined: dict[str, list[str]], calls: list[Call]) -> list[str]:
    return [
        f"{c.file}:{c.line}: {c.caller} calls llm.{c.callee}, defined later in {defined[c.callee][0]}"
        for c in calls
        if c.file not in MAY_CALL_FORWARD and defined[c.callee][0] > c.file
    ]


def test_each_sql_file_calls_only_itself_and_earlier_files():
    """issue 24 item 1: no routine of sql/ calls a routine defined in a later file, but
    the pass's (65_pass.sql, the documented exception)."""
    defined, calls = read_sql()
    assert calls, "no call found in sql/: the parser reads nothing"
    forward = forward_calls(defined, calls)
    assert not forward, "calls to later files:\n" + "\n".join(forward)


def test_each_routine_is_defined_by_one_file():
    """issue 24 item 1: a routine has one home, so "which file holds it" has one answer
    and the name order alone decides what a file may call."""
    defined, _ = read_sql()
    twice = [
        f"llm.{name}: {', '.join(files)}" for name, files in defined.items() if len(set(files)) > 1
    ]
    assert not twice, "routines defined by two files:\n" + "\n".join(twice)


def test_the_exception_is_used():
    """issue 24 item 1: the allow-list stays minimal. The pass does call forward (else it
    would not need to be listed), and every file listed exists."""
    defined, calls = read_sql()
    for file in MAY_CALL_FORWARD:
        assert (SQL_DIR / file).is_file(), file
        assert any(c.file == file and defined[c.callee][0] > file for c in calls), file


def test_the_parser_skips_comments_and_strings_but_reads_bodies():
    """issue 24 item 1: the parser counts calls in routine bodies, and not the names in a
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
    assert [m.group(1) for m in NAMED.finditer(code.text)] == ["f", "real_call", "f"]
    assert len(code.bodies) == 1 and code.text[code.bodies[0][0] :].startswith("$$")
