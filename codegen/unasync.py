"""The one way llm-db is both sync and async: the asyncio code is written, the sync
code is written from it by ``scripts/generate_client.py``.

The rule is ``unasync``, a fixed list of replacements (``await`` goes, ``async def`` is
``def``, ``AsyncLlm`` is ``Llm``, ``async_deliver_notices`` is ``deliver_notices``, …),
applied to:

- each operation's method of ``AsyncLlmMethods`` and ``AsyncExecutionContextMethods``,
  which give those of ``LlmMethods`` and ``ExecutionContextMethods``
  (``llm_db/_client_methods.py``, generated whole from ``codegen.operations``);
- each hand-written asyncio definition of ``TWINS``, which gives its sync twin in the
  same file, right after it, under the line ``MARK``: ``AsyncLlm`` gives ``Llm``,
  ``async_with_llm_execution`` gives ``with_llm_execution``, and so on.

A twin keeps its own docstrings (a sync function's documentation says nothing of
asyncio), and nothing else of its own: edit the asyncio definition, then run the
script. tests/test_generated_client.py fails when a twin differs from what the rule
writes.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# In this order: keywords, then names. A name is renamed wherever it stands as a word.
VOCABULARY: tuple[tuple[str, str], ...] = (
    (r"\basync def\b", "def"),
    (r"\basync with\b", "with"),
    (r"\basync for\b", "for"),
    (r"\bawait ", ""),
    (r"\basynccontextmanager\b", "contextmanager"),
    (r"\basyncio\.sleep\b", "time.sleep"),
    (r"\baiter_bytes\b", "iter_bytes"),
    (r"\bAwaitable\[(\w+)\]", r"\1"),
    (r"\bAsync(?=[A-Z])", ""),  # AsyncLlm, AsyncConnection, AsyncCursor, AsyncClient, …
    (r"\b_async_(?=\w)", "_"),  # _async_hops
    (r"\basync_(?=\w)", ""),  # async_deliver_notices, async_with_llm_execution
)

#: The line above each twin in its file.
MARK = "# The sync twin of the definition above: written by scripts/generate_client.py."


# What the vocabulary does not read: left in its output, it would be asyncio code in a
# sync twin (an awaited call the list has no sync name for, an async dunder).
UNREAD = re.compile(r"\bawait\b|\basyncio\.|\bAwaitable\b|\b__a\w+__\b|\ba(?:close|iter|next)\b")


def unasync(text: str, *, check: bool = True) -> str:
    """``text`` (asyncio code) as the sync code it stands for; ValueError naming what it
    cannot read (add a replacement to ``VOCABULARY``), unless ``check`` is False."""
    for pattern, replacement in VOCABULARY:
        text = re.sub(pattern, replacement, text)
    return _checked(text) if check else text


def _checked(text: str) -> str:
    left = UNREAD.search(text)
    if left:
        line = text.count("\n", 0, left.start()) + 1
        raise ValueError(f"unasync: no sync word for {left[0]!r} (line {line} of the definition)")
    return text


@dataclass(frozen=True)
class Twin:
    """A top-level asyncio definition (a function or a class) of ``path`` and the name
    of its sync twin (``unasync`` of its name)."""

    path: Path
    name: str

    @property
    def twin(self) -> str:
        return unasync(self.name)


TWINS = (
    Twin(ROOT / "llm_db" / "client.py", "AsyncLlm"),
    Twin(ROOT / "llm_db" / "executions.py", "_async_hops"),
    Twin(ROOT / "llm_db" / "executions.py", "async_with_llm_execution"),
    Twin(ROOT / "llm_db" / "service" / "notices.py", "async_http_client"),
    Twin(ROOT / "llm_db" / "service" / "notices.py", "async_post_notice"),
    Twin(ROOT / "llm_db" / "service" / "notices.py", "_async_deliveries"),
    Twin(ROOT / "llm_db" / "service" / "notices.py", "async_deliver_claimed"),
    Twin(ROOT / "llm_db" / "service" / "notices.py", "async_deliver_notices"),
)


def _definition(tree: ast.Module, name: str) -> ast.stmt:
    found = [n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
             and n.name == name]  # fmt: skip
    if len(found) != 1:
        raise LookupError(f"{name}: {len(found)} top-level definitions of that name")
    return found[0]


def _span(node: ast.stmt) -> tuple[int, int]:
    """The lines of a definition, its decorators included (0-based, end exclusive)."""
    first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
    assert node.end_lineno is not None
    return first - 1, node.end_lineno


def _docstrings(node: ast.AST) -> dict[str, ast.Constant]:
    """The docstring of a definition and of each definition in it, by qualified name."""
    found: dict[str, ast.Constant] = {}
    for child in ast.walk(node):
        if not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        body = child.body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):  # fmt: skip
            name = child.name if child is node else f"{node.name}.{child.name}"  # type: ignore[attr-defined]
            found.setdefault(name, body[0].value)
    return found


def _span_of(text: str, node: ast.expr) -> tuple[int, int]:
    """Where ``node`` stands in ``text``, as string offsets (ast counts a column in
    UTF-8 bytes, and a docstring may hold a "…")."""
    lines = text.splitlines(keepends=True)

    def offset(line: int, column: int) -> int:
        return sum(map(len, lines[: line - 1])) + len(lines[line - 1].encode()[:column].decode())

    assert node.end_lineno is not None and node.end_col_offset is not None
    return offset(node.lineno, node.col_offset), offset(node.end_lineno, node.end_col_offset)


def twin_text(source: str, spec: Twin) -> str:
    """The sync twin of ``spec.name`` in ``source``: its text unasynced, with the
    docstrings the twin now in ``source`` has (where it has one)."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    start, end = _span(_definition(tree, spec.name))
    # checked once the twin's own docstrings replaced the asyncio ones, which may speak
    # of asyncio
    text = unasync("".join(lines[start:end]), check=False)
    try:
        current = _definition(tree, spec.twin)
    except LookupError:
        return _checked(text)
    keep = {name: ast.get_source_segment(source, node) for name, node in _docstrings(current).items()}
    # from the last docstring up, so the offsets of those before it stay right
    spans = sorted((_span_of(text, node), keep[name])
                   for name, node in _docstrings(ast.parse(text).body[0]).items() if name in keep)  # fmt: skip
    for (first, last), doc in reversed(spans):
        text = text[:first] + str(doc) + text[last:]
    return _checked(text)


def rewrite(source: str, spec: Twin) -> str:
    """``source`` with the sync twin of ``spec.name`` written right after it, under
    ``MARK`` (replacing the twin and its mark where they are)."""
    twin = twin_text(source, spec)
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    try:
        start, end = _span(_definition(tree, spec.twin))
        if start and lines[start - 1].rstrip("\n") == MARK:
            start -= 1
        lines[start:end] = []
        while start < len(lines) and not lines[start].strip() and start >= 2 \
                and not lines[start - 1].strip() and not lines[start - 2].strip():  # fmt: skip
            del lines[start]  # no more than the two blank lines between definitions
        tree = ast.parse("".join(lines))
    except LookupError:
        pass
    _, after = _span(_definition(tree, spec.name))
    block = ["\n", "\n", MARK + "\n", twin if twin.endswith("\n") else twin + "\n"]
    # the blank lines around a definition, as ruff wants them: two before, and two after
    while lines[after:] and not lines[after].strip():
        del lines[after]
    rest = ["\n", "\n", *lines[after:]] if lines[after:] else []
    return "".join([*lines[:after], *block, *rest])


def write_twins() -> list[Path]:
    """Rewrite every twin of ``TWINS``; the files changed."""
    changed = []
    for path in sorted({spec.path for spec in TWINS}):
        source = original = path.read_text(encoding="utf-8")
        for spec in (s for s in TWINS if s.path == path):
            source = rewrite(source, spec)
        if source != original:
            path.write_text(source, encoding="utf-8")
            changed.append(path)
    return changed
