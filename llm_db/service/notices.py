"""Webhook delivery of threshold notices, signed as Standard Webhooks.

``deliver_notices`` claims due notices (owed -> sending), POSTs each as JSON to
one URL and records the answer: a 2xx completes the notice (sending -> sent);
anything else - another status, a timeout, a refused connection - returns it
to owed with the error and a backoff computed in SQL (``llm.fail_notice``).
Nothing is lost while the endpoint is down: the notice stays owed and a later
run delivers it. If the deliverer itself dies mid-run, its claimed notices are
re-armed by ``llm.rearm_notices`` (the hourly pass) once the claim expires.

Each claim carries a token (``Notice.claim_token``), and only the live claim's
token ends it. A deliverer so slow that its claim expired, was re-armed and was
claimed again by another gets False from ``complete_notice`` / ``fail_notice``
and changes nothing: that notice is counted ``lost`` and logged (logger
``llm_db.service.notices``), and the other deliverer's claim stands.
``llm-db worker`` (``llm_db.service.worker``) runs the same delivery continuously.

Delivery is at least once: a receiver that answered too slowly, or a claim
that expired while the POST was under way, can see a notice again. Receivers
deduplicate on the ``webhook-id`` header (the notice id: one notice per
organization, budget, window and threshold, the same on every retry).

The request follows the Standard Webhooks specification (standardwebhooks.com),
so any of its libraries verifies it:

    POST <url>
    Content-Type: application/json
    webhook-id: <notice id>
    webhook-timestamp: <unix seconds when sent>
    webhook-signature: v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}"> [v1,<...> ...]

    {"data": {"allowance_credits": 100, "attempts": 1,
              "crossed_at": "2030-01-10T12:00:00+00:00", "limit_credits": 100,
              "notice_id": "...", "organization_id": "...",
              "period_start": "2030-01-01", "scope": "organization", "scope_id": null,
              "threshold_pct": 80, "used_credits": 85, "window": "month",
              "window_start": "2030-01-01"},
     "timestamp": "2030-01-10T12:00:00+00:00", "type": "llm.threshold_crossed"}

That is a notice of the monthly allowance, as before budgets plus
``scope``, ``scope_id``, ``window``, ``window_start`` and ``limit_credits``. A
budget's notice is another event, ``"type": "llm.budget_threshold_crossed"``,
with the same data but for ``period_start`` and ``allowance_credits``: a receiver
written for the allowance's notices, which dispatches on ``type``, is never told
that a per-user daily budget is its organization's allowance. Its ``scope_id`` is
the real id (null for the organization's day and week budgets).

A limit that refused an admission (the allowance or a budget; its commitments,
used + held + estimate, would have passed it) owes one more notice per window, on
its first refusal: ``"type": "llm.limit_reached"`` (``LIMIT_EVENT_TYPE``), whose
data names ``scope``, ``scope_id``, ``window``, ``window_start``,
``limit_credits``, the ``used_credits`` when it was reported and ``refused_at``.

Secrets have the Standard Webhooks form ``whsec_<base64 of 24 to 64 random
bytes>`` (``new_secret()``, ``llm-db notices new-secret``). To rotate, give
several secrets separated by spaces: each delivery carries one signature per
secret, and a receiver that knows any one of them verifies it.

A receiver verifies with ``standardwebhooks.Webhook(secret).verify(body,
headers)``, or with ``verify_webhook`` here, which also accepts several secrets
and a tolerance other than five minutes.

Signing, verifying and delivering need the ``worker`` extra (``httpx``,
``standardwebhooks``): ``pip install 'llm-db[worker]'``. They are imported when
first used, so ``import llm_db`` works without them.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import dataclasses
import functools
import json
import logging
import secrets as _random
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from llm_db._extras import require
from llm_db.client import AsyncLlm, Llm
from llm_db.models import Notice

if TYPE_CHECKING:
    import httpx

# the name it logged under before the move to llm_db/service/, which log filters use
log = logging.getLogger("llm_db.notices")

__all__ = [
    "BUDGET_EVENT_TYPE",
    "LIMIT_EVENT_TYPE",
    "DEFAULT_TOLERANCE",
    "EVENT_TYPE",
    "ID_HEADER",
    "SECRET_PREFIX",
    "SIGNATURE_HEADER",
    "TIMESTAMP_HEADER",
    "DeliverySummary",
    "InvalidSecret",
    "async_deliver_notices",
    "deliver_notices",
    "new_secret",
    "notice_body",
    "parse_secrets",
    "verify_webhook",
    "webhook_headers",
]

ID_HEADER = "webhook-id"
TIMESTAMP_HEADER = "webhook-timestamp"
SIGNATURE_HEADER = "webhook-signature"
SECRET_PREFIX = "whsec_"
#: the ``type`` of the JSON body of the monthly allowance's notices
EVENT_TYPE = "llm.threshold_crossed"
#: the ``type`` of the JSON body of a budget's notices
BUDGET_EVENT_TYPE = "llm.budget_threshold_crossed"
#: the ``type`` of the JSON body of a limit's first refusal in a window (any limit)
LIMIT_EVENT_TYPE = "llm.limit_reached"
#: seconds a ``webhook-timestamp`` may differ from the receiver's clock (the spec's five minutes)
DEFAULT_TOLERANCE = 300
#: the Standard Webhooks range for a secret's random bytes
SECRET_BYTES = range(24, 65)

#: the longest error text ``fail_notice`` accepts
MAX_ERROR_CHARS = 4000
USER_AGENT = "llm-db notices"

HOW_TO_MAKE_A_SECRET = (
    "a secret is whsec_ followed by the base64 of 24 to 64 random bytes "
    "(Standard Webhooks); make one with `llm-db notices new-secret`"
)


class InvalidSecret(ValueError):
    """A webhook secret that is not ``whsec_<base64 of 24 to 64 bytes>``; the message says
    how to make one."""


@dataclasses.dataclass(frozen=True, slots=True)
class DeliverySummary:
    """What one run did: notices claimed, sent (2xx), failed (owed again, with backoff) and
    lost (the claim expired and was taken by another deliverer before this run ended it)."""

    claimed: int
    sent: int
    failed: int
    last_error: str | None = None
    lost: int = 0


# ----------------------------------------------------------- secrets, body, signature


def new_secret(nbytes: int = 32) -> str:
    """A fresh random secret in the Standard Webhooks form ``whsec_<base64>``."""
    if nbytes not in SECRET_BYTES:
        raise ValueError(f"a secret has 24 to 64 random bytes, not {nbytes}")
    return SECRET_PREFIX + base64.b64encode(_random.token_bytes(nbytes)).decode()


def _secret_bytes(secret: str) -> bytes:
    if not secret.startswith(SECRET_PREFIX):
        raise InvalidSecret(f"webhook secret does not start with {SECRET_PREFIX}: "
                            f"{HOW_TO_MAKE_A_SECRET}")  # fmt: skip
    encoded = secret[len(SECRET_PREFIX) :]
    try:
        key = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise InvalidSecret(
            f"webhook secret {SECRET_PREFIX}... is not valid base64: {HOW_TO_MAKE_A_SECRET}"
        ) from None
    if len(key) not in SECRET_BYTES:
        raise InvalidSecret(
            f"webhook secret {SECRET_PREFIX}... holds {len(key)} bytes: {HOW_TO_MAKE_A_SECRET}"
        )
    return key


def parse_secrets(value: str | Iterable[str]) -> list[str]:
    """The secrets in ``value`` (one string, several separated by whitespace, or a list),
    each checked to be ``whsec_<base64 of 24 to 64 bytes>`` (``InvalidSecret`` otherwise)."""
    words = value.split() if isinstance(value, str) else [w for v in value for w in v.split()]
    if not words:
        raise InvalidSecret(f"no webhook secret given: {HOW_TO_MAKE_A_SECRET}")
    for word in words:
        _secret_bytes(word)
    return words


def notice_body(notice: Notice) -> bytes:
    """The JSON body POSTed for a notice (compact, keys sorted): the Standard Webhooks
    envelope ``{"type", "timestamp", "data"}``; ``timestamp`` is when the threshold was
    crossed. ``type`` is ``EVENT_TYPE`` for the allowance's notices, which keep their
    fields of 0.2.0 (``period_start``, ``allowance_credits``), and ``BUDGET_EVENT_TYPE``
    for a budget's, ``LIMIT_EVENT_TYPE`` for a limit's first refusal (module doc)."""
    # every event names its limit and window (keys sorted on output, so order is free)
    data: dict[str, Any] = {
        "organization_id": str(notice.organization_id),
        "notice_id": str(notice.id),
        "scope": notice.scope,
        "scope_id": notice.scope_id,
        "window": notice.budget_window,
        "window_start": notice.window_start.isoformat(),
        "used_credits": notice.used_credits,
        "limit_credits": notice.limit_credits,
        "attempts": notice.attempts,
    }
    if notice.is_limit_reached:
        data["refused_at"] = notice.crossed_at.isoformat()
        return _body(LIMIT_EVENT_TYPE, notice.crossed_at, data)
    data["threshold_pct"] = notice.threshold_pct
    data["crossed_at"] = notice.crossed_at.isoformat()
    if notice.is_allowance:
        data["period_start"] = data["window_start"]
        data["allowance_credits"] = data["limit_credits"]
    return _body(EVENT_TYPE if notice.is_allowance else BUDGET_EVENT_TYPE, notice.crossed_at, data)


def _body(kind: str, at: datetime, data: dict[str, Any]) -> bytes:
    payload = {"type": kind, "timestamp": at.isoformat(), "data": data}
    return json.dumps(payload, separators=(",", ":"), sort_keys=True).encode()


def _signatures(msg_id: str, timestamp: int, body: bytes, keys: Sequence[str]) -> list[str]:
    webhooks = require("standardwebhooks")
    moment = datetime.fromtimestamp(timestamp, tz=UTC)
    text = body.decode()
    return [webhooks.Webhook(key).sign(msg_id, moment, text) for key in keys]


def webhook_headers(
    msg_id: str, body: bytes, secrets: str | Iterable[str], *, timestamp: int | None = None
) -> dict[str, str]:
    """The Standard Webhooks headers for ``body``: ``webhook-id``, ``webhook-timestamp``
    (``timestamp``, default now) and ``webhook-signature`` with one ``v1,`` signature per
    secret."""
    keys = parse_secrets(secrets)
    when = int(time.time()) if timestamp is None else int(timestamp)
    return {
        ID_HEADER: msg_id,
        TIMESTAMP_HEADER: str(when),
        SIGNATURE_HEADER: " ".join(_signatures(msg_id, when, body, keys)),
    }


def verify_webhook(
    body: bytes | str,
    headers: Mapping[str, str],
    secrets: str | Iterable[str],
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    now: float | None = None,
) -> Any:
    """Check a delivery as a receiver: returns the parsed JSON body, or raises
    ``standardwebhooks.WebhookVerificationError``.

    Rejects missing headers, a ``webhook-timestamp`` more than ``tolerance``
    seconds from ``now`` (default: this machine's clock) either way, and a body,
    id or timestamp that no ``v1`` signature signs with any of ``secrets``
    (several secrets: during a rotation). Header names are case-insensitive.
    """
    webhooks = require("standardwebhooks")
    keys = parse_secrets(secrets)
    data = body if isinstance(body, str) else body.decode()
    lower = {k.lower(): v for k, v in headers.items()}
    msg_id = lower.get(ID_HEADER)
    stamp = lower.get(TIMESTAMP_HEADER)
    signature = lower.get(SIGNATURE_HEADER)
    if not (msg_id and stamp and signature):
        raise webhooks.WebhookVerificationError("Missing required headers")
    try:
        sent_at = int(stamp)
    except ValueError:
        raise webhooks.WebhookVerificationError("Invalid Signature Headers") from None
    clock = time.time() if now is None else now
    if sent_at < clock - tolerance:
        raise webhooks.WebhookVerificationError("Message timestamp too old")
    if sent_at > clock + tolerance:
        raise webhooks.WebhookVerificationError("Message timestamp too new")
    expected = [s.encode() for s in _signatures(msg_id, sent_at, data.encode(), keys)]
    given = [s.encode() for s in signature.split() if s.startswith("v1,")]
    if not any(_random.compare_digest(e, g) for e in expected for g in given):
        raise webhooks.WebhookVerificationError("No matching signature found")
    return json.loads(data)


# ----------------------------------------------------------- one POST


@dataclasses.dataclass(frozen=True, slots=True)
class Attempt:
    """How one POST went: ``error`` None when delivered (2xx)."""

    error: str | None
    retry: bool = False  # worth another attempt in this run
    unreachable: bool = False  # no HTTP answer at all (refused, timeout, reset)
    status: int | None = None  # the HTTP status, when there was an answer


_NOT_ATTEMPTED = "not attempted: the endpoint was unreachable earlier in this run"


def _check_url(url: str) -> None:
    scheme = urllib.parse.urlsplit(url).scheme
    if scheme not in ("http", "https"):
        raise ValueError(f"llm: notice webhook URL must be http or https, not {url!r}")


def _answer(status: int, reason: str, snippet: bytes) -> Attempt:
    if 200 <= status < 300:
        return Attempt(None, status=status)
    text = f"HTTP {status} {reason}".rstrip()
    shown = snippet.decode("utf-8", "replace").strip()
    if shown:
        text += f": {shown}"
    return Attempt(text, retry=status >= 500 or status in (408, 429), status=status)


def _no_answer(exc: Exception, timeout: float) -> Attempt:
    httpx = require("httpx")
    if isinstance(exc, httpx.TimeoutException):
        return Attempt(f"timeout after {timeout:g}s", retry=True, unreachable=True)
    return Attempt(f"connection failed: {exc or type(exc).__name__}", retry=True,
                   unreachable=True)  # fmt: skip


def async_http_client(timeout: float) -> httpx.AsyncClient:
    """The httpx client deliveries use: ``timeout`` for the connect and for each read
    and write, no redirects followed (a redirect is an answer, not a delivery)."""
    httpx = require("httpx")
    return httpx.AsyncClient(timeout=timeout, follow_redirects=False, headers={"User-Agent": USER_AGENT})


# The sync twin of the definition above: written by scripts/generate_client.py.
def http_client(timeout: float) -> httpx.Client:
    """The httpx client deliveries use: ``timeout`` for the connect and for each read
    and write, no redirects followed (a redirect is an answer, not a delivery)."""
    httpx = require("httpx")
    return httpx.Client(timeout=timeout, follow_redirects=False, headers={"User-Agent": USER_AGENT})


def _signed(notice: Notice, secrets: Sequence[str]) -> dict[str, Any]:
    """The body and headers of one POST of ``notice``, signed now (``webhook-timestamp``
    is the moment of sending)."""
    body = notice_body(notice)
    return {"content": body, "headers": {"Content-Type": "application/json",
                                         **webhook_headers(str(notice.id), body, secrets)}}  # fmt: skip


async def async_post_notice(
    http: httpx.AsyncClient, url: str, notice: Notice, secrets: Sequence[str], timeout: float
) -> Attempt:
    """POST one notice, freshly signed (``webhook-timestamp`` is the moment of sending)."""
    httpx = require("httpx")
    try:
        async with http.stream("POST", url, **_signed(notice, secrets)) as response:
            snippet = b""
            if not response.is_success:
                async for chunk in response.aiter_bytes():
                    snippet += chunk
                    if len(snippet) >= 300:
                        break
            return _answer(response.status_code, response.reason_phrase, snippet[:300])
    except httpx.HTTPError as exc:
        return _no_answer(exc, timeout)


# The sync twin of the definition above: written by scripts/generate_client.py.
def post_notice(
    http: httpx.Client, url: str, notice: Notice, secrets: Sequence[str], timeout: float
) -> Attempt:
    """POST one notice, freshly signed (``webhook-timestamp`` is the moment of sending)."""
    httpx = require("httpx")
    try:
        with http.stream("POST", url, **_signed(notice, secrets)) as response:
            snippet = b""
            if not response.is_success:
                for chunk in response.iter_bytes():
                    snippet += chunk
                    if len(snippet) >= 300:
                        break
            return _answer(response.status_code, response.reason_phrase, snippet[:300])
    except httpx.HTTPError as exc:
        return _no_answer(exc, timeout)


# ----------------------------------------------------------- runs


@dataclasses.dataclass
class _Tally:
    """A run's counts, and whether the endpoint already proved unreachable in it."""

    claimed: int
    sent: int = 0
    failed: int = 0
    lost: int = 0
    last_error: str | None = None
    unreachable: str | None = None

    def summary(self) -> DeliverySummary:
        return DeliverySummary(self.claimed, self.sent, self.failed, self.last_error, self.lost)

    def attempts(self, max_attempts_per_run: int) -> int:
        """How many POSTs the next notice gets: none once the endpoint proved unreachable."""
        return 0 if self.unreachable is not None else max(1, max_attempts_per_run)

    def record(self, attempt: Attempt | None) -> Attempt:
        """A notice's last attempt (None: it got no POST, which is returned as its
        attempt, its error no longer than ``fail_notice`` takes); an unreachable endpoint
        is remembered for the rest of the run."""
        if attempt is None:
            attempt = Attempt(f"{_NOT_ATTEMPTED} ({self.unreachable})")
        elif attempt.unreachable:
            self.unreachable = attempt.error
        if attempt.error is not None:
            attempt = dataclasses.replace(attempt, error=attempt.error[:MAX_ERROR_CHARS])
        return attempt

    def count(self, notice: Notice, attempt: Attempt, ended: bool) -> str:
        """Counts a notice by how its claim ended, and returns that outcome: ``lost`` when
        the claim was no longer this run's (``ended`` False: logged), else ``sent`` or
        ``failed`` (its error kept in ``last_error``)."""
        if attempt.error is not None:
            self.last_error = attempt.error
        if not ended:
            self.lost += 1
            log.warning("claim lost: notice %s of organization %s was re-armed and claimed "
                        "again before this run ended its claim", notice.id,
                        notice.organization_id)  # fmt: skip
            return "lost"
        if attempt.error is None:
            self.sent += 1
            return "sent"
        self.failed += 1
        return "failed"


#: ``on_result(notice, attempt, outcome, seconds)`` after each notice's claim was ended:
#: outcome ``sent``, ``failed`` or ``lost`` (another deliverer holds the claim now)
ResultHook = Callable[[Notice, Attempt, str, float], None]


async def _async_deliveries(
    client: AsyncLlm,
    notices: Sequence[Notice],
    post: Callable[[Notice], Awaitable[Attempt]],
    *,
    max_attempts_per_run: int,
    pause: float,
    now: datetime | None,
    should_stop: Callable[[], bool] | None = None,
    on_result: ResultHook | None = None,
) -> tuple[DeliverySummary, list[Notice]]:
    """The delivery of notices already claimed: for each, its POSTs (``pause`` apart),
    then the call that ends its claim."""
    tally = _Tally(len(notices))
    for index, notice in enumerate(notices):
        if should_stop is not None and should_stop():
            return tally.summary(), list(notices[index:])
        started = time.monotonic()
        attempt: Attempt | None = None
        for n in range(tally.attempts(max_attempts_per_run)):
            if n and pause > 0:
                await asyncio.sleep(pause)
            attempt = await post(notice)
            if attempt.error is None or not attempt.retry or (should_stop is not None and should_stop()):
                break
        attempt = tally.record(attempt)
        key = (notice.organization_id, notice.id, notice.claim_token)
        if attempt.error is None:
            ended = await client.complete_notice(*key, now=now)
        else:
            ended = await client.fail_notice(*key, attempt.error, now=now)
        outcome = tally.count(notice, attempt, ended)
        if on_result is not None:
            on_result(notice, attempt, outcome, time.monotonic() - started)
    return tally.summary(), []


# The sync twin of the definition above: written by scripts/generate_client.py.
def _deliveries(
    client: Llm,
    notices: Sequence[Notice],
    post: Callable[[Notice], Attempt],
    *,
    max_attempts_per_run: int,
    pause: float,
    now: datetime | None,
    should_stop: Callable[[], bool] | None = None,
    on_result: ResultHook | None = None,
) -> tuple[DeliverySummary, list[Notice]]:
    """The delivery of notices already claimed: for each, its POSTs (``pause`` apart),
    then the call that ends its claim."""
    tally = _Tally(len(notices))
    for index, notice in enumerate(notices):
        if should_stop is not None and should_stop():
            return tally.summary(), list(notices[index:])
        started = time.monotonic()
        attempt: Attempt | None = None
        for n in range(tally.attempts(max_attempts_per_run)):
            if n and pause > 0:
                time.sleep(pause)
            attempt = post(notice)
            if attempt.error is None or not attempt.retry or (should_stop is not None and should_stop()):
                break
        attempt = tally.record(attempt)
        key = (notice.organization_id, notice.id, notice.claim_token)
        if attempt.error is None:
            ended = client.complete_notice(*key, now=now)
        else:
            ended = client.fail_notice(*key, attempt.error, now=now)
        outcome = tally.count(notice, attempt, ended)
        if on_result is not None:
            on_result(notice, attempt, outcome, time.monotonic() - started)
    return tally.summary(), []


async def async_deliver_claimed(
    client: AsyncLlm,
    http: httpx.AsyncClient,
    url: str,
    secrets: Sequence[str],
    notices: Sequence[Notice],
    *,
    timeout: float,
    max_attempts_per_run: int = 3,
    pause: float = 0.5,
    now: datetime | None = None,
    should_stop: Callable[[], bool] | None = None,
    on_result: ResultHook | None = None,
) -> tuple[DeliverySummary, list[Notice]]:
    """Deliver notices already claimed, one after another; returns the summary and the
    notices not started because ``should_stop()`` turned true (still ``sending``: the
    caller releases them)."""
    post = functools.partial(async_post_notice, http, url, secrets=secrets, timeout=timeout)
    return await _async_deliveries(
        client, notices, post, max_attempts_per_run=max_attempts_per_run, pause=pause, now=now,
        should_stop=should_stop, on_result=on_result,
    )  # fmt: skip


# The sync twin of the definition above: written by scripts/generate_client.py.
def deliver_claimed(
    client: Llm,
    http: httpx.Client,
    url: str,
    secrets: Sequence[str],
    notices: Sequence[Notice],
    *,
    timeout: float,
    max_attempts_per_run: int = 3,
    pause: float = 0.5,
    now: datetime | None = None,
    should_stop: Callable[[], bool] | None = None,
    on_result: ResultHook | None = None,
) -> tuple[DeliverySummary, list[Notice]]:
    """Deliver notices already claimed, one after another; returns the summary and the
    notices not started because ``should_stop()`` turned true (still ``sending``: the
    caller releases them)."""
    post = functools.partial(post_notice, http, url, secrets=secrets, timeout=timeout)
    return _deliveries(
        client, notices, post, max_attempts_per_run=max_attempts_per_run, pause=pause, now=now,
        should_stop=should_stop, on_result=on_result,
    )  # fmt: skip


async def async_deliver_notices(
    client: AsyncLlm,
    url: str,
    secrets: str | Iterable[str],
    *,
    limit: int = 50,
    timeout: float = 5.0,
    max_attempts_per_run: int = 3,
    pause: float = 0.5,
    now: datetime | None = None,
) -> DeliverySummary:
    """``deliver_notices`` for asyncio, over ``httpx.AsyncClient``."""
    _check_url(url)
    keys = parse_secrets(secrets)
    async with async_http_client(timeout) as http:
        notices = await client.claim_notices(limit=limit, now=now)
        summary, _ = await async_deliver_claimed(
            client, http, url, keys, notices, timeout=timeout,
            max_attempts_per_run=max_attempts_per_run, pause=pause, now=now,
        )  # fmt: skip
    return summary


# The sync twin of the definition above: written by scripts/generate_client.py.
def deliver_notices(
    client: Llm,
    url: str,
    secrets: str | Iterable[str],
    *,
    limit: int = 50,
    timeout: float = 5.0,
    max_attempts_per_run: int = 3,
    pause: float = 0.5,
    now: datetime | None = None,
) -> DeliverySummary:
    """Claim up to ``limit`` due notices and POST each to ``url``; one run.

    ``secrets``: one ``whsec_`` secret, or several (a list, or separated by
    spaces) during a rotation: each POST carries one signature per secret.
    Each notice gets up to ``max_attempts_per_run`` POSTs in this run, ``pause``
    seconds apart (a 4xx other than 408/429 is not retried); ``timeout`` bounds
    the connect and each read and write. When a notice got no HTTP answer at all,
    the rest of this run's notices are failed without a POST, so a dead endpoint
    costs one notice's attempts, not all of them. ``now`` is the clock for
    claim, completion and backoff (the signature's timestamp is always the real
    time of sending). A claim lost meanwhile (``complete_notice`` or ``fail_notice``
    answered False: it expired and another deliverer holds it now) is counted ``lost``
    and logged.
    """
    _check_url(url)
    keys = parse_secrets(secrets)
    with http_client(timeout) as http:
        notices = client.claim_notices(limit=limit, now=now)
        summary, _ = deliver_claimed(
            client, http, url, keys, notices, timeout=timeout,
            max_attempts_per_run=max_attempts_per_run, pause=pause, now=now,
        )  # fmt: skip
    return summary
