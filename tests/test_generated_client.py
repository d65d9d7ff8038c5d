"""The driver's methods are plain code generated from its table of operations:
llm_db/_client_methods.py is what scripts/generate_client.py writes, its
statements are the ones the table builds, and the clients and task contexts have them as
real methods, not stubs. Like schema.sql, the file is checked in; after a change of the
table, rewrite it with ``.venv/bin/python scripts/generate_client.py`` and commit it.
"""

from __future__ import annotations

import difflib
import importlib.util
import inspect
import sys
from pathlib import Path

import pytest

from codegen import unasync
from codegen.operations import TASK_HELPERS, operations
from llm_db import _client_methods
from llm_db.client import AsyncLlm, Llm
from llm_db.executions import AsyncExecutionContext, ExecutionContext

ROOT = Path(__file__).resolve().parent.parent
# scripts/ is no package: load the generator from its file
SPEC = importlib.util.spec_from_file_location(
    "llm_db_generate_client", ROOT / "scripts" / "generate_client.py"
)
assert SPEC is not None and SPEC.loader is not None
generator = sys.modules["llm_db_generate_client"] = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(generator)


def stale(written: str, kept: str) -> str:
    """The diff from the checked-in file to what the generator writes, with the command
    that rewrites it; empty when they agree."""
    diff = "".join(
        difflib.unified_diff(
            kept.splitlines(keepends=True),
            written.splitlines(keepends=True),
            "llm_db/_client_methods.py (committed)",
            "llm_db/_client_methods.py (generator)",
            n=2,
        )  # fmt: skip
    )
    if not diff:
        return ""
    return (
        f"llm_db/_client_methods.py is stale; rewrite it with `{generator.COMMAND}`:\n{diff[:6000]}"
    )


def test_the_methods_file_is_what_the_generator_writes() -> None:
    """The generated client is checked in and equal to the generator's
    output, as schema.sql is to a fresh migrate."""
    wrong = stale(generator.render(), generator.OUT.read_text(encoding="utf-8"))
    assert not wrong, wrong


# ---------------------------------------------------------------- one way to be sync and async


@pytest.mark.parametrize("spec", unasync.TWINS, ids=lambda spec: spec.name)
def test_each_sync_twin_is_what_the_rule_writes_from_its_asyncio_definition(spec) -> None:
    """``Llm``, ``with_llm_execution``, ``deliver_notices``, …: the file holds the sync
    twin right after the asyncio definition, under its mark, equal to what unasync
    writes from it (its own docstrings kept). Rewrite with the generator."""
    source = spec.path.read_text(encoding="utf-8")
    assert unasync.rewrite(source, spec) == source, f"{spec.path.name}: {spec.twin} is stale; run `{generator.COMMAND}`"
    assert f"{unasync.MARK}\n" in source


def test_the_sync_methods_are_the_rule_applied_to_the_asyncio_ones() -> None:
    """The operations' methods too: each of LlmMethods is unasync of AsyncLlmMethods'."""
    for op in operations().values():
        written = inspect.getsource(getattr(_client_methods.AsyncLlmMethods, op.name))
        assert inspect.getsource(getattr(_client_methods.LlmMethods, op.name)) == unasync.unasync(written)


def test_a_twin_edited_by_hand_is_rewritten_and_its_docstring_kept() -> None:
    """The check can fail: a line of a twin changed by hand is written back, and the
    twin's own docstring (here, one that differs from its asyncio definition's) stays."""
    spec = next(s for s in unasync.TWINS if s.name == "async_with_llm_execution")
    source = spec.path.read_text(encoding="utf-8")
    edited = source.replace("    return _hops(", "    return _hops(  # edited by hand\n       ", 1)
    assert edited != source
    assert unasync.rewrite(edited, spec) == source
    assert '"""Run ``body(ctx)`` as one declared task' in source.split(unasync.MARK)[-1]


def test_unasync_reads_asyncio_code_as_the_sync_code_it_stands_for() -> None:
    assert unasync.unasync(
        "async def async_deliver(c: AsyncLlm) -> AsyncIterator[int]:\n"
        "    async with c.connection() as conn:\n"
        "        await asyncio.sleep(1)\n"
        "        return await _async_hops(conn)\n"
    ) == (
        "def deliver(c: Llm) -> Iterator[int]:\n"
        "    with c.connection() as conn:\n"
        "        time.sleep(1)\n"
        "        return _hops(conn)\n"
    )


def test_a_stale_methods_file_is_reported_with_the_command() -> None:
    """The comparison can fail: one line changed by hand is shown, with the command."""
    written = generator.render()
    edited = written.replace("return value_as(value, Outcome)", "return Outcome(value)", 1)
    assert edited != written
    report = stale(written, edited)
    assert generator.COMMAND in report and "-        return Outcome(value)" in report
    assert stale(written, written) == ""


def test_each_statement_is_the_one_the_table_builds() -> None:
    """The generated SQL constants are the table's statements, letter for
    letter (``SELECT … FROM llm.<routine>(p_… => %(…)s::<type>, …)``), and the file holds
    no statement the table lacks."""
    table = operations()
    for name, op in table.items():
        assert getattr(_client_methods, name.upper()) == op.sql, name
    constants = {n for n, v in vars(_client_methods).items() if n.isupper() and isinstance(v, str)}
    assert constants - {"TASK_DEFAULT"} == {name.upper() for name in table}


def test_clients_and_task_contexts_have_real_methods_with_the_entries_signatures() -> None:
    """"go to definition" lands on a real method of the generated module,
    with the entry's signature and documentation, whose body names its statement; the
    asyncio ones are coroutine functions. Task helpers hide the organization and the task."""
    for op in operations().values():
        for cls, asynchronous in ((Llm, False), (AsyncLlm, True)):
            method = getattr(cls, op.name)
            assert inspect.getmodule(method) is _client_methods, (cls, op.name)
            assert inspect.iscoroutinefunction(method) is asynchronous
            shown = str(inspect.signature(method)).replace("(self, ", "(").replace("(self)", "()")
            assert shown == str(op.signature), op.name
            assert inspect.getdoc(method) == op.doc
            assert op.name.upper() in inspect.getsource(method), op.name
    for name in TASK_HELPERS:
        for cls, asynchronous in ((ExecutionContext, False), (AsyncExecutionContext, True)):
            method = getattr(cls, name)
            assert inspect.getmodule(method) is _client_methods, (cls, name)
            assert inspect.iscoroutinefunction(method) is asynchronous
            assert {"organization_id", "execution_id"}.isdisjoint(
                inspect.signature(method).parameters
            )
            assert f"self.client.{name}(" in inspect.getsource(method)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda llm: llm.admit("org", 1, "m", estimate=3),
            "unexpected keyword argument 'estimate'",
        ),
        (lambda llm: llm.admit("org", 1), "missing 1 required positional argument: 'model'"),
        (
            lambda llm: llm.admit("org", 1, "m", "x"),
            "takes 4 positional arguments but 5 were given",
        ),
        (lambda llm: llm.admit("org", 1, "m", model="n"), "multiple values for argument 'model'"),
    ],
)
def test_python_checks_the_arguments_before_any_statement(call, message) -> None:
    """The generated methods are plain Python: Python itself refuses wrong arguments, before
    any connection is used (the source here is no connection at all)."""
    with pytest.raises(TypeError, match=message):
        call(Llm(source=None))
