"""Webhook delivery of threshold notices.

``deliver_notices`` claims due notices (owed -> sending), POSTs each as JSON to
one URL and records the answer: a 2xx completes the notice (sending -> sent);
anything else - another status, a timeout, a refused connection - returns it
to owed with the error and a backoff computed in SQL (``llm.fail_notice``).
Nothing is lost while the endpoint is down: the notice stays owed and a later
run delivers it. If the deliverer itself dies mid-run, its claimed notices are
re-armed by ``llm.rearm_notices`` (the hourly pass) once the claim expires.

Delivery is at least once: a receiver that answered too slowly, or a claim
that expired while the POST was under way, can see a notice again. Receivers
deduplicate on ``notice_id`` (one notice per organization, period and
threshold).

The request:

    POST <url>
    Content-Type: application/json
    X-LLM-Signature: sha256=<hex HMAC-SHA256 of the raw body with the secret>
    X-LLM-Timestamp: <unix seconds when sent>

    {"allowance_credits": 100, "attempts": 1, "crossed_at": "2030-01-10T12:00:00+00:00",
     "notice_id": "...", "organization_id": "...", "period_start": "2030-01-01",
     "threshold_pct": 80, "used_credits": 85}

A receiver checks the signature over the raw body with ``verify_signature``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import hmac
import http.client
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from datetime import datetime

from llm_db.models import Notice
from llm_db.requests import AsyncLlm, Llm

__all__ = [
    "SIGNATURE_HEADER",
    "TIMESTAMP_HEADER",
    "DeliverySummary",
    "async_deliver_notices",
    "deliver_notices",
    "notice_body",
    "sign",
    "verify_signature",
]

SIGNATURE_HEADER = "X-LLM-Signature"
TIMESTAMP_HEADER = "X-LLM-Timestamp"

#: the longest error text ``fail_notice`` accepts
MAX_ERROR_CHARS = 4000


@dataclasses.dataclass(frozen=True, slots=True)
class DeliverySummary:
    """What one run did: notices claimed, sent (2xx) and failed (owed again, with backoff)."""

    claimed: int
    sent: int
    failed: int
    last_error: str | None = None


def notice_body(notice: Notice) -> bytes:
    """The JSON body POSTed for a notice (compact, keys sorted)."""
    payload = {
        "organization_id": str(notice.organization_id),
        "notice_id": str(notice.id),
        "period_start": notice.period_start.isoformat(),
        "threshold_pct": notice.threshold_pct,
        "used_credits": notice.used_credits,
        "allowance_credits": notice.allowance_credits,
        "crossed_at": notice.crossed_at.isoformat(),
        "attempts": notice.attempts,
    }
    return json.dumps(payload, separators=(",", ":"), sort_keys=True).encode()


def _key(secret: str | bytes) -> bytes:
    return secret.encode() if isinstance(secret, str) else secret


def sign(body: bytes, secret: str | bytes) -> str:
    """The ``X-LLM-Signature`` value for a body: ``sha256=<hex hmac>``."""
    return "sha256=" + hmac.new(_key(secret), body, hashlib.sha256).hexdigest()


def verify_signature(body: bytes, header: str | None, secret: str | bytes) -> bool:
    """True when ``header`` (the ``X-LLM-Signature`` value) signs the raw ``body``.

    Compares in constant time; a missing or malformed header is False.
    """
    if not header:
        return False
    return hmac.compare_digest(sign(body, secret).encode(), header.strip().encode())


# ----------------------------------------------------------- one POST


@dataclasses.dataclass(frozen=True, slots=True)
class _Attempt:
    error: str | None  # None: delivered (2xx)
    retry: bool = False  # worth another attempt in this run
    unreachable: bool = False  # no HTTP answer at all (refused, timeout, reset)


_DELIVERED = _Attempt(None)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is an answer, not a delivery: report it instead of following it."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


_opener = urllib.request.build_opener(_NoRedirect)


def _check_url(url: str) -> None:
    scheme = urllib.parse.urlsplit(url).scheme
    if scheme not in ("http", "https"):
        raise ValueError(f"llm: notice webhook URL must be http or https, not {url!r}")


def _post(url: str, body: bytes, secret: str | bytes, timeout: float) -> _Attempt:
    request = urllib.request.Request(
        url,
        data=body,
        method="POST",
        headers={
            "Content-Type": "application/json",
            "User-Agent": "llm-db notices",
            SIGNATURE_HEADER: sign(body, secret),
            TIMESTAMP_HEADER: str(int(time.time())),
        },
    )
    try:
        with _opener.open(request, timeout=timeout) as response:
            response.read(64 * 1024)
            status = response.status
    except urllib.error.HTTPError as exc:  # an answer other than 2xx (redirects included)
        snippet = ""
        try:
            snippet = exc.read(300).decode("utf-8", "replace").strip()
        except (OSError, http.client.HTTPException):
            pass
        retry = exc.code >= 500 or exc.code in (408, 429)
        text = f"HTTP {exc.code} {exc.reason}" + (f": {snippet}" if snippet else "")
        return _Attempt(text, retry=retry)
    except TimeoutError:
        return _Attempt(f"timeout after {timeout:g}s", retry=True, unreachable=True)
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, TimeoutError):
            return _Attempt(f"timeout after {timeout:g}s", retry=True, unreachable=True)
        return _Attempt(f"connection failed: {exc.reason}", retry=True, unreachable=True)
    except (OSError, http.client.HTTPException) as exc:
        return _Attempt(f"connection failed: {exc!r}", retry=True, unreachable=True)
    if 200 <= status < 300:
        return _DELIVERED
    return _Attempt(f"HTTP {status}", retry=status >= 500)


def _give_up_text(unreachable: str) -> str:
    return f"not attempted: the endpoint was unreachable earlier in this run ({unreachable})"


# ----------------------------------------------------------- runs


def deliver_notices(
    client: Llm,
    url: str,
    secret: str | bytes,
    *,
    limit: int = 50,
    timeout: float = 5.0,
    max_attempts_per_run: int = 3,
    pause: float = 0.5,
    now: datetime | None = None,
) -> DeliverySummary:
    """Claim up to ``limit`` due notices and POST each to ``url``; one run.

    Each notice gets up to ``max_attempts_per_run`` POSTs in this run, ``pause``
    seconds apart (a 4xx other than 408/429 is not retried); ``timeout`` bounds
    each connect and each read. When a notice got no HTTP answer at all, the
    rest of this run's notices are failed without a POST, so a dead endpoint
    costs one notice's attempts, not all of them. ``now`` is the clock for
    claim, completion and backoff.
    """
    _check_url(url)
    notices = client.claim_notices(limit=limit, now=now)
    sent = failed = 0
    last_error: str | None = None
    unreachable: str | None = None
    for notice in notices:
        if unreachable is not None:
            attempt = _Attempt(_give_up_text(unreachable))
        else:
            body = notice_body(notice)
            for n in range(max(1, max_attempts_per_run)):
                if n and pause > 0:
                    time.sleep(pause)
                attempt = _post(url, body, secret, timeout)
                if attempt.error is None or not attempt.retry:
                    break
            if attempt.unreachable:
                unreachable = attempt.error
        if attempt.error is None:
            client.complete_notice(notice.organization_id, notice.id, now=now)
            sent += 1
        else:
            last_error = attempt.error[:MAX_ERROR_CHARS]
            client.fail_notice(notice.organization_id, notice.id, last_error, now=now)
            failed += 1
    return DeliverySummary(len(notices), sent, failed, last_error)


async def async_deliver_notices(
    client: AsyncLlm,
    url: str,
    secret: str | bytes,
    *,
    limit: int = 50,
    timeout: float = 5.0,
    max_attempts_per_run: int = 3,
    pause: float = 0.5,
    now: datetime | None = None,
) -> DeliverySummary:
    """``deliver_notices`` for asyncio: the POSTs run in a worker thread."""
    _check_url(url)
    notices = await client.claim_notices(limit=limit, now=now)
    sent = failed = 0
    last_error: str | None = None
    unreachable: str | None = None
    for notice in notices:
        if unreachable is not None:
            attempt = _Attempt(_give_up_text(unreachable))
        else:
            body = notice_body(notice)
            for n in range(max(1, max_attempts_per_run)):
                if n and pause > 0:
                    await asyncio.sleep(pause)
                attempt = await asyncio.to_thread(_post, url, body, secret, timeout)
                if attempt.error is None or not attempt.retry:
                    break
            if attempt.unreachable:
                unreachable = attempt.error
        if attempt.error is None:
            await client.complete_notice(notice.organization_id, notice.id, now=now)
            sent += 1
        else:
            last_error = attempt.error[:MAX_ERROR_CHARS]
            await client.fail_notice(notice.organization_id, notice.id, last_error, now=now)
            failed += 1
    return DeliverySummary(len(notices), sent, failed, last_error)
