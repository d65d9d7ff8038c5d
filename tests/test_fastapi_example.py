"""docs/integration.md's FastAPI endpoint, run as an application: the block marked
``python fastapi-app`` is executed as a module against this test's database, logged in
as ``llm_app`` as a consumer service is, and driven through FastAPI's test client.

A retry sends the same ``Idempotency-Key``: a completed request is answered from the
books (its stored charge, or its stored error) without calling the provider again, one
in flight gets 409, one admitted but never dispatched is taken over once, and a refusal
is HTTP 402 with its figures. Before 0.4.0 the retry of a completed call raised LL009
from ``mark_dispatched`` and the endpoint answered HTTP 500.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from llm_db.client import Llm
from llm_db.testing._server import LOGINS
from tests.helpers import invariants
from tests.test_integration_doc import blocks

fastapi_testclient = pytest.importorskip("fastapi.testclient")

MODEL = "gpt-4o"


@dataclasses.dataclass
class Answer:
    credits: int
    cents: int
    input_tokens: int
    output_tokens: int
    text: str


class Provider:
    """The model provider the endpoint calls: counts its calls, fails when told to."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.fail = False

    def __call__(self, model: str, prompt: str) -> Answer:
        self.calls.append(prompt)
        if self.fail:
            raise TimeoutError("the provider timed out")
        return Answer(credits=120, cents=4, input_tokens=30, output_tokens=50, text=prompt.upper())


@pytest.fixture
def provider() -> Provider:
    return Provider()


@pytest.fixture
def client(llm_dsn: str, provider: Provider, monkeypatch) -> Iterator[Any]:
    monkeypatch.setenv("DATABASE_URL", psycopg.conninfo.make_conninfo(llm_dsn, user=LOGINS["llm_app"]))
    ((line, code),) = blocks("python", "fastapi-app")
    namespace: dict = {"__name__": "fastapi_example", "call_the_provider": provider}
    exec(compile(code, f"integration.md:{line}", "exec"), namespace)
    with fastapi_testclient.TestClient(namespace["app"], raise_server_exceptions=False) as test_client:
        yield test_client


@pytest.fixture
def books(llm_conn: psycopg.Connection) -> Llm:
    return Llm(llm_conn)


@pytest.fixture
def org(books: Llm) -> uuid.UUID:
    org_id = uuid.uuid4()
    books.upsert_organization(org_id, "acme", 10_000)
    return org_id


def post(client, org: uuid.UUID, key: uuid.UUID | None, **body: Any):
    headers = {"Idempotency-Key": str(key)} if key else {}
    return client.post(f"/organizations/{org}/completions", json={"prompt": "hi", **body},
                       headers=headers)  # fmt: skip


def used(books: Llm, conn: psycopg.Connection, org: uuid.UUID) -> int:
    return conn.execute("SELECT coalesce(sum(used_credits), 0) FROM llm.periods WHERE organization_id = %s",
                        [org]).fetchone()[0]  # fmt: skip


def test_a_new_request_is_sent_settled_and_answered(client, provider, books, llm_conn, org):
    answer = post(client, org, uuid.uuid4())
    assert answer.status_code == 200, answer.text
    assert answer.json() | {"request_id": None} == {
        "request_id": None, "replayed": False, "status": "settled",
        "charged_credits": 120, "charged_cents": 4, "text": "HI",
    }  # fmt: skip
    assert provider.calls == ["hi"]
    assert used(books, llm_conn, org) == 120
    assert invariants(llm_conn) == []


def test_the_retry_of_a_completed_call_answers_its_stored_outcome(client, provider, books, llm_conn, org):
    key = uuid.uuid4()
    first = post(client, org, key)
    retry = post(client, org, key)
    assert (first.status_code, retry.status_code) == (200, 200), retry.text
    assert retry.json() == {"request_id": str(key), "replayed": True, "status": "settled",
                            "charged_credits": 120, "charged_cents": 4}  # fmt: skip
    assert provider.calls == ["hi"], "a replay must not call the provider again"
    assert used(books, llm_conn, org) == 120
    assert invariants(llm_conn) == []


def test_the_retry_of_a_failed_call_answers_its_stored_error(client, provider, books, llm_conn, org):
    key = uuid.uuid4()
    provider.fail = True
    first = post(client, org, key)
    provider.fail = False
    retry = post(client, org, key)
    assert (first.status_code, retry.status_code) == (502, 502)
    assert retry.json()["detail"] == {"request_id": str(key), "error": "TimeoutError('the provider timed out')"}
    assert len(provider.calls) == 1
    assert used(books, llm_conn, org) == 0
    assert invariants(llm_conn) == []


def test_a_retry_while_the_first_try_is_in_flight_gets_409(client, provider, books, org):
    key = uuid.uuid4()
    books.admit(org, 500, MODEL, invocation_id=key)
    books.mark_dispatched(org, key)  # the first try is waiting on the provider
    answer = post(client, org, key)
    assert answer.status_code == 409 and answer.headers["Retry-After"] == "5"
    assert provider.calls == []


def test_a_request_admitted_but_never_dispatched_is_taken_over_once(client, provider, books, llm_conn, org):
    key = uuid.uuid4()
    books.admit(org, 500, MODEL, invocation_id=key)  # the first try died before sending it
    answer = post(client, org, key)
    assert answer.status_code == 200 and answer.json()["replayed"] is False
    assert provider.calls == ["hi"]
    assert post(client, org, key).json()["replayed"] is True
    assert provider.calls == ["hi"]
    assert invariants(llm_conn) == []


def test_a_refusal_is_402_with_its_figures_and_the_window_end(client, provider, books, llm_conn, org):
    books.set_budget(org, "end_user", "*", "day", 1_000)
    assert post(client, org, uuid.uuid4(), user="u-1", max_credits=600).status_code == 200
    refused = post(client, org, uuid.uuid4(), user="u-1", max_credits=950)
    assert refused.status_code == 402
    today = datetime.now(UTC).date()
    tomorrow = datetime.fromordinal(today.toordinal() + 1).replace(tzinfo=UTC)
    assert refused.json()["detail"] == {
        "refused_by": {"scope": "end_user", "id": "u-1", "window": "day"},
        "limit_credits": 1_000, "left_credits": 880, "asked_credits": 950,
        "resets_at": tomorrow.isoformat(),
    }  # fmt: skip
    assert 1 <= int(refused.headers["Retry-After"]) <= 86_400
    assert provider.calls == ["hi"]
    assert invariants(llm_conn) == []


def test_a_key_reused_for_another_request_is_422(client, provider, org):
    key = uuid.uuid4()
    assert post(client, org, key).status_code == 200
    assert post(client, org, key, max_credits=7).status_code == 422
    assert provider.calls == ["hi"]


def test_a_suspended_or_unknown_organization_is_403(client, provider, books, org):
    books.upsert_organization(org, "acme", 10_000, status="suspended")
    assert post(client, org, uuid.uuid4()).status_code == 403
    assert post(client, uuid.uuid4(), None).status_code == 403
    assert provider.calls == []
