"""Threshold notice delivery (``llm_db.service.notices``) against a real HTTP server on
127.0.0.1 run in a thread that verifies every delivery with the
``standardwebhooks`` package (Standard Webhooks): delivered and
signed, endpoint down (connection refused, then up), endpoint slow (timeout),
non-2xx answers. Nothing is lost: every notice that was not delivered is owed
again with its error and a backoff in the future, and a later run at a later
``now`` delivers it. Then the package's own verifier: replays outside the
tolerance, other secrets, rotation with two secrets, secrets without whsec_.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta

import psycopg
import pytest
import standardwebhooks

from llm_db.client import AsyncLlm, Llm
from llm_db.service.notices import (
    BUDGET_EVENT_TYPE,
    EVENT_TYPE,
    ID_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    DeliverySummary,
    InvalidSecret,
    async_deliver_notices,
    deliver_claimed,
    deliver_notices,
    http_client,
    new_secret,
    parse_secrets,
    verify_webhook,
)
from tests.helpers import JANUARY, T0, notices
from tests.receiver import Received, Receiver

MINUTE = timedelta(minutes=1)
# fixed test secrets (base64 of 32 bytes each), never used anywhere real
SECRET = "whsec_" + base64.b64encode(b"llm-db test secret, thirty-two b.").decode()
OTHER_SECRET = "whsec_" + base64.b64encode(b"llm-db other secret, 32 bytes ok").decode()


def standard_verify(body: bytes, headers: dict[str, str], secret: str = SECRET) -> bool:
    """What a receiver using the standardwebhooks package decides."""
    try:
        standardwebhooks.Webhook(secret).verify(body, headers)
    except standardwebhooks.WebhookVerificationError:
        return False
    return True


@pytest.fixture
def endpoint() -> Iterator[Receiver]:
    with Receiver(SECRET, status=200) as server:
        yield server


@pytest.fixture
def llm(llm_conn: psycopg.Connection) -> Llm:
    return Llm(llm_conn)


def crossing_80_and_100(llm: Llm) -> uuid.UUID:
    """An organization with allowance 100 whose usage crosses 80 %, then 100 %."""
    org = uuid.uuid4()
    llm.upsert_organization(org, "notified", 100, now=T0)
    first = llm.admit(org, 85, "model-a", now=T0)
    llm.settle(org, first.id, 85, 10, now=T0)
    second = llm.admit(org, 15, "model-a", now=T0 + MINUTE)
    llm.settle(org, second.id, 20, 2, now=T0 + MINUTE)
    return org


def test_notices_are_delivered_signed_and_marked_sent(
    llm: Llm, llm_conn: psycopg.Connection, endpoint: Receiver
) -> None:
    org = crossing_80_and_100(llm)
    endpoint.up()
    at = T0 + 2 * MINUTE
    summary = deliver_notices(llm, endpoint.url, SECRET, now=at)
    assert summary == DeliverySummary(claimed=2, sent=2, failed=0)

    assert [r.verified for r in endpoint.received] == [True, True]
    assert {r.path for r in endpoint.received} == {"/hooks/llm"}
    envelopes = [json.loads(r.body) for r in endpoint.received]
    assert {(e["type"], e["timestamp"]) for e in envelopes} == {
        ("llm.threshold_crossed", T0.isoformat()), ("llm.threshold_crossed", (T0 + MINUTE).isoformat())}
    payloads = sorted((e["data"] for e in envelopes), key=lambda p: p["threshold_pct"])
    stored = notices(llm_conn, org)
    assert payloads == [
        {
            "organization_id": str(org),
            "notice_id": str(n["id"]),
            "period_start": str(JANUARY),
            "threshold_pct": n["threshold_pct"],
            "used_credits": n["used_credits"],
            "allowance_credits": 100,
            "crossed_at": n["crossed_at"].isoformat(),
            "attempts": 1,
            # Every notice names its budget; the allowance's keeps its 0.2.0 fields
            "scope": "organization",
            "scope_id": None,
            "window": "month",
            "window_start": str(JANUARY),
            "limit_credits": 100,
        }
        for n in stored
    ]
    assert [(p["threshold_pct"], p["used_credits"]) for p in payloads] == [(80, 85), (100, 105)]
    for received in endpoint.received:
        assert received.headers["content-type"] == "application/json"
        # Standard Webhooks: the notice id, the unix time of sending, one v1 signature
        assert received.headers[ID_HEADER] == json.loads(received.body)["data"]["notice_id"]
        assert abs(int(received.headers[TIMESTAMP_HEADER]) - time.time()) < 60
        assert received.headers[SIGNATURE_HEADER].startswith("v1,")
        assert len(received.headers[SIGNATURE_HEADER].split()) == 1
        assert not standard_verify(received.body, received.headers, OTHER_SECRET)
    assert [(n["status"], n["sent_at"], n["last_error"]) for n in stored] == [
        ("sent", at, None), ("sent", at, None),
    ]
    # nothing owed any more
    assert deliver_notices(llm, endpoint.url, SECRET, now=at + MINUTE).claimed == 0


def test_a_budget_s_notice_is_its_own_event_naming_scope_id_window_and_window_start(
    llm: Llm, llm_conn: psycopg.Connection, endpoint: Receiver
) -> None:
    """A budget's thresholds are notified through the same claim and delivery as
    the allowance's; the payload names scope, scope_id (the real id; null for the
    organization scope), window and window_start, under the type llm.budget_threshold_crossed
    and without the allowance's period_start and allowance_credits, so a receiver written for
    the allowance's llm.threshold_crossed never takes it for the allowance."""
    org = uuid.uuid4()
    llm.upsert_organization(org, "budgets", None, now=T0)  # no allowance: no notice of it
    llm.set_budget(org, "organization", None, "day", 200, thresholds=[40], now=T0)
    llm.set_budget(org, "end_user", "*", "week", 100, thresholds=[80], now=T0)
    inv = llm.admit(org, 85, "model-a", now=T0, end_user="user 7")
    llm.settle(org, inv.id, 85, 10, now=T0)
    claimed = sorted(llm.claim_notices(now=T0), key=lambda n: n.scope)
    assert [(n.scope, n.scope_id, n.budget_window, n.is_allowance) for n in claimed] == [
        ("end_user", "user 7", "week", False), ("organization", None, "day", False)]  # fmt: skip
    for n in claimed:
        llm.release_notice(org, n.id, n.claim_token, now=T0)

    endpoint.up()
    assert deliver_notices(llm, endpoint.url, SECRET, now=T0).sent == 2
    assert [r.verified for r in endpoint.received] == [True, True]
    envelopes = sorted((json.loads(r.body) for r in endpoint.received),
                       key=lambda e: e["data"]["scope"])  # fmt: skip
    assert {e["type"] for e in envelopes} == {BUDGET_EVENT_TYPE} != {EVENT_TYPE}
    stored = {n["id"]: n for n in notices(llm_conn, org)}
    monday = T0.date() - timedelta(days=T0.weekday())
    expected = [("end_user", "user 7", "week", str(monday), 80, 100),
                ("organization", None, "day", str(T0.date()), 40, 200)]  # fmt: skip
    for envelope, (scope, scope_id, window, start, pct, limit) in zip(
        envelopes, expected, strict=True
    ):
        data = envelope["data"]
        assert data == {
            "organization_id": str(org),
            "notice_id": data["notice_id"],
            "scope": scope,
            "scope_id": scope_id,
            "window": window,
            "window_start": start,
            "threshold_pct": pct,
            "used_credits": 85,
            "limit_credits": limit,
            "crossed_at": T0.isoformat(),
            "attempts": 1,  # the release above counted no attempt
        }
        assert stored[uuid.UUID(data["notice_id"])]["status"] == "sent"


def test_a_run_whose_claims_were_taken_again_counts_them_lost_and_changes_nothing(
    llm: Llm, llm_conn: psycopg.Connection, endpoint: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    """A deliverer so slow that its claims expired, were re-armed and were
    claimed again by another gets False from complete_notice: each notice is counted lost
    and logged, and the other deliverer's claims stand (it completes them)."""
    org = crossing_80_and_100(llm)
    endpoint.up()
    slow = llm.claim_notices(now=T0 + 2 * MINUTE)
    assert llm.rearm_notices(now=T0 + 17 * MINUTE) == 2
    other = llm.claim_notices(now=T0 + 17 * MINUTE)
    with http_client(5.0) as http, caplog.at_level(logging.WARNING, logger="llm_db.notices"):
        summary, _ = deliver_claimed(llm, http, endpoint.url, parse_secrets(SECRET), slow,
                                     timeout=5.0, now=T0 + 18 * MINUTE)  # fmt: skip
    assert summary == DeliverySummary(claimed=2, sent=0, failed=0, lost=2)
    assert len(endpoint.received) == 2  # POSTed: delivery is at least once
    assert sum("claim lost" in r.getMessage() for r in caplog.records) == 2
    stored = notices(llm_conn, org)
    assert {(n["status"], n["claim_token"]) for n in stored} == {("sending", n.claim_token) for n in other}
    for n in other:
        assert llm.complete_notice(org, n.id, n.claim_token, now=T0 + 19 * MINUTE) is True
    assert llm.check_invariants() == []


def test_endpoint_down_leaves_notices_owed_with_backoff_then_a_later_run_delivers(
    llm: Llm, llm_conn: psycopg.Connection, endpoint: Receiver
) -> None:
    org = crossing_80_and_100(llm)
    t1 = T0 + 2 * MINUTE

    down = deliver_notices(llm, endpoint.url, SECRET, now=t1, pause=0)
    assert (down.claimed, down.sent, down.failed) == (2, 0, 2)
    stored = notices(llm_conn, org)
    assert [n["status"] for n in stored] == ["owed", "owed"]
    assert all(n["next_attempt_at"] > t1 for n in stored)
    assert all(n["attempts"] == 1 and n["sent_at"] is None for n in stored)
    first, second = sorted(stored, key=lambda n: n["crossed_at"])
    assert "connection failed" in first["last_error"]
    # the dead endpoint cost one notice's attempts; the rest were not POSTed
    assert second["last_error"].startswith("not attempted")

    # not due yet: a run at the same instant claims nothing
    assert deliver_notices(llm, endpoint.url, SECRET, now=t1).claimed == 0

    endpoint.up()
    later = max(n["next_attempt_at"] for n in stored) + MINUTE
    up = deliver_notices(llm, endpoint.url, SECRET, now=later)
    assert up == DeliverySummary(claimed=2, sent=2, failed=0)
    delivered = notices(llm_conn, org)
    assert [(n["status"], n["attempts"], n["sent_at"]) for n in delivered] == [
        ("sent", 2, later), ("sent", 2, later),
    ]
    assert sorted(json.loads(r.body)["data"]["attempts"] for r in endpoint.received) == [2, 2]
    # the id receivers deduplicate on is the notice id, the same on every retry
    assert {r.headers[ID_HEADER] for r in endpoint.received} == {str(n["id"]) for n in delivered}


def test_endpoint_slower_than_the_timeout_fails_the_notice_and_loses_nothing(
    llm: Llm, llm_conn: psycopg.Connection, endpoint: Receiver
) -> None:
    org = crossing_80_and_100(llm)
    endpoint.up()
    endpoint.delay = 5.0  # released at teardown; the client gives up after 0.3 s
    t1 = T0 + 2 * MINUTE

    slow = deliver_notices(llm, endpoint.url, SECRET, now=t1, timeout=0.3,
                           max_attempts_per_run=1)
    assert (slow.claimed, slow.sent, slow.failed) == (2, 0, 2)
    assert slow.last_error is not None
    stored = notices(llm_conn, org)
    assert all(n["status"] == "owed" and n["next_attempt_at"] > t1 for n in stored)
    first = min(stored, key=lambda n: n["crossed_at"])
    assert first["last_error"] == "timeout after 0.3s"
    assert len(endpoint.received) == 1  # the second was not sent into a stalled endpoint

    endpoint.delay = 0.0
    later = t1 + 10 * MINUTE
    assert deliver_notices(llm, endpoint.url, SECRET, now=later).sent == 2
    assert [n["status"] for n in notices(llm_conn, org)] == ["sent", "sent"]


@pytest.mark.parametrize(
    ("status", "headers", "posts_per_notice", "error"),
    [
        (500, {}, 3, "HTTP 500"),
        (429, {}, 3, "HTTP 429"),
        (400, {}, 1, "HTTP 400"),
        (302, {"Location": "http://127.0.0.1:1/elsewhere"}, 1, "HTTP 302"),
    ],
)
def test_a_non_2xx_answer_fails_the_notice_with_its_status(
    llm: Llm,
    llm_conn: psycopg.Connection,
    endpoint: Receiver,
    status: int,
    headers: dict[str, str],
    posts_per_notice: int,
    error: str,
) -> None:
    org = crossing_80_and_100(llm)
    endpoint.up()
    endpoint.status = status
    endpoint.headers_out = headers
    t1 = T0 + 2 * MINUTE

    summary = deliver_notices(llm, endpoint.url, SECRET, now=t1, pause=0)
    assert (summary.claimed, summary.sent, summary.failed) == (2, 0, 2)
    assert len(endpoint.received) == 2 * posts_per_notice  # an HTTP answer is not "down"
    stored = notices(llm_conn, org)
    assert all(n["status"] == "owed" and n["last_error"].startswith(error) for n in stored)
    assert all(n["next_attempt_at"] > t1 for n in stored)


def test_a_non_http_url_is_rejected_before_anything_is_claimed(
    llm: Llm, llm_conn: psycopg.Connection
) -> None:
    org = crossing_80_and_100(llm)
    with pytest.raises(ValueError):
        deliver_notices(llm, "file:///etc/passwd", SECRET, now=T0 + MINUTE)
    assert [n["status"] for n in notices(llm_conn, org)] == ["owed", "owed"]


def test_async_deliverer_sends_and_recovers_from_a_down_endpoint(
    llm: Llm, llm_dsn: str, llm_conn: psycopg.Connection, endpoint: Receiver
) -> None:
    org = crossing_80_and_100(llm)
    t1 = T0 + 2 * MINUTE

    async def scenario() -> tuple[DeliverySummary, DeliverySummary]:
        async with await psycopg.AsyncConnection.connect(llm_dsn, autocommit=True) as conn:
            client = AsyncLlm(conn)
            down = await async_deliver_notices(client, endpoint.url, SECRET, now=t1, pause=0)
            endpoint.up()
            up = await async_deliver_notices(client, endpoint.url, SECRET, now=t1 + 10 * MINUTE)
            return down, up

    down, up = asyncio.run(scenario())
    assert (down.claimed, down.failed, up.claimed, up.sent) == (2, 2, 2, 2)
    assert all(r.verified for r in endpoint.received)
    assert [n["status"] for n in notices(llm_conn, org)] == ["sent", "sent"]


# ---------------------------------------------------------------- the verifier, rotation, secrets


def one_delivery(llm: Llm, endpoint: Receiver, secrets: str | list[str]) -> Received:
    crossing_80_and_100(llm)
    endpoint.up()
    assert deliver_notices(llm, endpoint.url, secrets, limit=1, now=T0 + 2 * MINUTE).sent == 1
    (received,) = endpoint.received
    return received


def test_a_replay_outside_the_tolerance_is_rejected_by_the_verifier(
    llm: Llm, endpoint: Receiver
) -> None:
    """Issue #13: the timestamp is signed, so a captured delivery replayed later is refused: as
    it was sent, once its webhook-timestamp is more than 5 minutes (the default tolerance) from
    the receiver's clock either way; and with a fresh timestamp the signature no longer
    matches."""
    got = one_delivery(llm, endpoint, SECRET)
    sent_at = int(got.headers[TIMESTAMP_HEADER])
    payload = verify_webhook(got.body, got.headers, SECRET, now=sent_at + 299)
    assert payload["data"]["threshold_pct"] == 80
    assert verify_webhook(got.body, got.headers, SECRET, now=sent_at - 299) == payload
    for later, why in ((sent_at + 301, "too old"), (sent_at - 301, "too new"),
                       (sent_at + 7 * 86400, "too old")):  # fmt: skip
        with pytest.raises(standardwebhooks.WebhookVerificationError, match=why):
            verify_webhook(got.body, got.headers, SECRET, now=later)
    # a wider tolerance is the receiver's choice
    assert verify_webhook(got.body, got.headers, SECRET, now=sent_at + 3600, tolerance=7200)
    # re-POSTed 7 days later with a fresh timestamp: the old signature does not sign it
    fresh = {**got.headers, TIMESTAMP_HEADER: str(sent_at + 7 * 86400)}
    with pytest.raises(standardwebhooks.WebhookVerificationError, match="No matching signature"):
        verify_webhook(got.body, fresh, SECRET, now=sent_at + 7 * 86400)
    # the same with the reference library: a timestamp changed by one second breaks the signature
    assert not standard_verify(got.body, {**got.headers, TIMESTAMP_HEADER: str(sent_at + 1)})


def test_the_verifier_rejects_another_secret_a_changed_body_id_or_missing_headers(
    llm: Llm, endpoint: Receiver
) -> None:
    got = one_delivery(llm, endpoint, SECRET)
    assert verify_webhook(got.body, got.headers, SECRET)
    nope = standardwebhooks.WebhookVerificationError
    with pytest.raises(nope, match="No matching signature"):
        verify_webhook(got.body, got.headers, OTHER_SECRET)
    with pytest.raises(nope, match="No matching signature"):
        verify_webhook(got.body.replace(b'"threshold_pct":80', b'"threshold_pct":10'),
                       got.headers, SECRET)  # fmt: skip
    with pytest.raises(nope, match="No matching signature"):
        verify_webhook(got.body, {**got.headers, ID_HEADER: str(uuid.uuid4())}, SECRET)
    for missing in (ID_HEADER, TIMESTAMP_HEADER, SIGNATURE_HEADER):
        headers = {k: v for k, v in got.headers.items() if k != missing}
        with pytest.raises(nope, match="Missing required headers"):
            verify_webhook(got.body, headers, SECRET)
    with pytest.raises(nope):
        verify_webhook(got.body, {**got.headers, SIGNATURE_HEADER: "v1,AAAA garbage"}, SECRET)
    # header names are case-insensitive
    assert verify_webhook(got.body, {k.title(): v for k, v in got.headers.items()}, SECRET)


def test_rotation_with_two_secrets_signs_each_delivery_with_each(
    llm: Llm, endpoint: Receiver
) -> None:
    """Issue #13, rotation: the secret variable holds two secrets separated by a space; each
    delivery carries one v1 signature per secret, so a receiver that knows either one (and only
    one) verifies with the standardwebhooks package; a third secret does not."""
    third = new_secret()
    got = one_delivery(llm, endpoint, f"{SECRET} {OTHER_SECRET}")
    signatures = got.headers[SIGNATURE_HEADER].split(" ")
    assert len(signatures) == 2 and all(s.startswith("v1,") for s in signatures)
    assert standard_verify(got.body, got.headers, SECRET)
    assert standard_verify(got.body, got.headers, OTHER_SECRET)
    assert not standard_verify(got.body, got.headers, third)
    assert verify_webhook(got.body, got.headers, [third, OTHER_SECRET])  # the receiver's side
    with pytest.raises(standardwebhooks.WebhookVerificationError):
        verify_webhook(got.body, got.headers, third)


@pytest.mark.parametrize(
    "secret",
    ["s3cret", "", "   ", "whsec_", "whsec_not base64!", "whsec_" + base64.b64encode(b"short").decode(),
     "whsec_" + base64.b64encode(bytes(65)).decode(), f"{SECRET} s3cret"],
)
def test_a_secret_that_is_not_whsec_base64_is_refused_with_how_to_make_one(secret: str) -> None:
    with pytest.raises(InvalidSecret, match="llm-db notices new-secret"):
        parse_secrets(secret)


def test_new_secret_is_a_valid_standard_webhooks_secret() -> None:
    made = {new_secret() for _ in range(5)}
    assert len(made) == 5 and all(s.startswith("whsec_") for s in made)
    assert all(len(base64.b64decode(s[6:])) == 32 for s in made)
    assert parse_secrets(" ".join(made)) == sorted(made, key=" ".join(made).index)
    assert len(base64.b64decode(new_secret(24)[6:])) == 24
    for secret in made:
        standardwebhooks.Webhook(secret)  # the reference library accepts it
