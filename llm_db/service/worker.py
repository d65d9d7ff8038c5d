"""``llm-db worker``: delivers threshold notices continuously and serves /metrics and /healthz.

One long-running process with three parts:

- **a LISTEN session** on channel ``llm_notices``. Every transaction that makes
  a notice owed (a settlement or a recovery crossing a threshold, a failed
  delivery's retry, a release, a re-arm) does ``NOTIFY llm_notices`` at commit,
  which wakes the worker at once. LISTEN needs a session of its own: a direct
  connection, or PgBouncer in session mode. At start the worker checks for one
  (its backend stays the same across two transactions, also while another
  connection holds a transaction open) and exits 2 when it has none.
- **the delivery loop**: claim up to ``limit`` due notices (``claim_notices``),
  POST each once with ``httpx``, signed as Standard Webhooks
  (``llm_db.service.notices``), then ``complete_notice`` or ``fail_notice`` (owed again
  after the backoff of ``llm.settings``) with the claim's token; repeat while full
  batches come back. A claim that expired and was claimed again by another worker
  is not this worker's any more: those calls answer False and change nothing, and
  the worker logs ``claim_lost`` and counts the outcome ``lost``.
  Then sleep until a NOTIFY, until the next owed notice is due, or ``poll``
  seconds (the fallback: under Citus the NOTIFY fires on the node that ran the
  transaction, see docs/scaling.md).
- **an HTTP server** (a thread) on ``metrics_addr``: ``/metrics`` is
  ``llm_db.service.metrics`` (``llm_up``, the scrape duration, the books' gauges) plus
  ``llm_notice_deliveries_total{outcome}`` (sent, failed, released, lost); ``/healthz`` answers 200 when the
  database answers and ``llm.reconciliation_health()`` is ok, 503 with a JSON
  reason otherwise.

Shutdown (SIGTERM, SIGINT): the notice being POSTed is finished (the POST is
bounded by ``timeout``), every other claimed notice is released
(``release_notice``: owed, due at once, no attempt counted), and the process
exits 0, leaving nothing ``sending``. After a SIGKILL its claims stay
``sending`` until the hourly pass re-arms them (``rearm_notices``, after
``llm.settings.notice_claim_timeout``); the receiver sees such a notice again
with the same ``webhook-id``.

A lost database connection is logged and retried with a growing pause (up to
``poll``); the notices claimed when it was lost are released after the
reconnect. One log line per event on stderr, text or JSON (``log_json``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.server
import json
import re
import signal
import socket
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import IO, Any
from uuid import UUID

import psycopg
from psycopg.conninfo import conninfo_to_dict

from llm_db import queries
from llm_db._extras import require
from llm_db.client import Llm
from llm_db.models import Notice
from llm_db.service.notices import Attempt, deliver_claimed, http_client

__all__ = [
    "CHANNEL",
    "ConfigError",
    "SessionRequired",
    "Worker",
    "WorkerConfig",
    "check_session",
    "parse_address",
]

CHANNEL = queries.NOTICES_CHANNEL
#: how often a sleeping worker looks at its stop flag (a NOTIFY wakes it at once)
WAIT_SLICE = 0.25
#: shortest pause before reconnecting to a lost database (doubles up to ``poll``)
RECONNECT_PAUSE = 0.5


class SessionRequired(RuntimeError):
    """The connection is pooled per transaction: LISTEN would not hear anything."""


class ConfigError(ValueError):
    """The worker cannot run with these settings (the message says which and why)."""


@dataclasses.dataclass(frozen=True, slots=True)
class WorkerConfig:
    dsn: str
    url: str
    secrets: list[str]
    metrics_addr: tuple[str, int] = ("127.0.0.1", 9187)
    poll: float = 30.0
    limit: int = 10
    timeout: float = 5.0
    log_json: bool = False


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9187`` for IPv6; port 0: any free port) as ``(host, port)``."""
    match = re.fullmatch(r"\[?([^\[\]]*?)\]?:(\d{1,5})", text.strip())
    if not match or int(match.group(2)) > 65535:
        raise ValueError(f"{text!r} is not HOST:PORT (e.g. 127.0.0.1:9187)")
    return match.group(1) or "0.0.0.0", int(match.group(2))


_NEEDS_QUOTES = re.compile(r'[\s="]')


def _redacted(url: str) -> str:
    """``url`` without a password or query string (the log may be read more widely)."""
    parts = urllib.parse.urlsplit(url)
    netloc = parts.netloc.rpartition("@")[2]
    if "@" in parts.netloc:
        netloc = f"{parts.username}:***@{netloc}" if parts.password else f"{parts.username}@{netloc}"
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def _one_line(value: object) -> str:
    return re.sub(r"\s+", " ", str(value)).strip()


# ----------------------------------------------------------- logging


class Log:
    """One line per event on ``stream``: ``<time> <level> <event> key=value ...`` or, with
    ``json_lines``, ``{"ts": ..., "level": ..., "event": ..., ...}``."""

    def __init__(self, json_lines: bool = False, stream: IO[str] | None = None) -> None:
        self.json_lines = json_lines
        self.stream = stream if stream is not None else sys.stderr
        self._lock = threading.Lock()

    def __call__(self, event: str, level: str = "info", **fields: Any) -> None:
        ts = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        if self.json_lines:
            line = json.dumps({"ts": ts, "level": level, "event": event, **fields}, default=str)
        else:
            parts = [ts, level, event]
            for key, value in fields.items():
                text = str(value)
                if _NEEDS_QUOTES.search(text):
                    text = json.dumps(text)
                parts.append(f"{key}={text}")
            line = " ".join(parts)
        with self._lock:
            self.stream.write(line + "\n")
            self.stream.flush()


# ----------------------------------------------------------- connections


def connect(dsn: str, purpose: str, **extra: Any) -> psycopg.Connection:
    """An autocommit connection named ``llm-db worker (<purpose>)`` unless the dsn names one."""
    given = conninfo_to_dict(dsn)
    if "application_name" not in given:
        extra.setdefault("application_name", f"llm-db worker ({purpose})"[:63])
    if "connect_timeout" not in given:
        extra.setdefault("connect_timeout", 10)
    return psycopg.connect(dsn, autocommit=True, **extra)


def _backend_pid(conn: psycopg.Connection) -> int:
    return conn.execute(queries.BACKEND_PID).fetchone()[0]


def check_session(listen: psycopg.Connection, other: psycopg.Connection) -> int:
    """Raise ``SessionRequired`` unless ``listen`` keeps one server session: its backend
    must be the same in two transactions, and ``other`` must not get that backend while
    it holds a transaction open in between (what a transaction-pooling PgBouncer does
    with an idle server connection). Returns the backend pid."""
    first = _backend_pid(listen)
    with other.transaction():
        borrowed = _backend_pid(other)
        second = _backend_pid(listen)
    if first != second or borrowed == first:
        raise SessionRequired(
            "llm-db worker needs a database session of its own for LISTEN llm_notices, and "
            f"this connection's server backend changed between transactions ({first}, then "
            f"{second}; another connection got {borrowed}): connect --dsn directly to "
            "PostgreSQL, or through PgBouncer in session mode (pool_mode = session), not "
            "transaction or statement pooling"
        )
    return first


# ----------------------------------------------------------- the worker


class Worker:
    """``Worker(config, log).run()`` until SIGTERM/SIGINT (or ``stop()``); returns the exit
    code (0: stopped cleanly, nothing left sending; 1: notices could not be released)."""

    def __init__(self, config: WorkerConfig, log: Log | None = None) -> None:
        prometheus = require("prometheus_client")
        require("httpx")
        require("standardwebhooks")
        self.config = config
        self.log = log if log is not None else Log(config.log_json)
        self.stopping = threading.Event()
        self.listen: psycopg.Connection | None = None
        self.work: psycopg.Connection | None = None
        self.listen_pid: int | None = None
        self.database_up = False
        self.claim_timeout: float | None = None
        #: claimed by this process and not yet completed, failed or released
        self.held: dict[tuple[UUID, UUID], Notice] = {}
        self.deliveries = prometheus.Counter(
            "llm_notice_deliveries",
            "Threshold notices this worker delivered (sent), failed (owed again after a "
            "backoff), released unsent at shutdown, or lost (its claim expired and another "
            "worker claimed the notice before this one ended its claim).",
            ["outcome"],
            registry=None,
        )
        for outcome in ("sent", "failed", "released", "lost"):
            self.deliveries.labels(outcome=outcome)
        self._probe_conn: psycopg.Connection | None = None
        self._probe_lock = threading.Lock()
        self._server: http.server.ThreadingHTTPServer | None = None
        self._http = http_client(config.timeout)

    # --- lifecycle ---------------------------------------------------------------

    def stop(self, *_: Any) -> None:
        """Ask the worker to stop (the signal handler)."""
        if not self.stopping.is_set():
            self.stopping.set()

    def run(self) -> int:
        previous = {s: signal.signal(s, self.stop) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            self._connect()
            self._check_claim_timeout()
            self._serve()
            self.log("started", url=_redacted(self.config.url), metrics_addr=self.metrics_address,
                     poll=self.config.poll, limit=self.config.limit,
                     timeout=self.config.timeout, listen_pid=self.listen_pid,
                     secrets=len(self.config.secrets))  # fmt: skip
            self._loop()
            self.log("stopping", held=len(self.held))
            left = self._release_held()
            self.log("stopped", left_sending=left)
            return 0 if left == 0 else 1
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self._close()

    @property
    def metrics_address(self) -> str:
        if self._server is None:
            return ""
        host, port = self._server.server_address[:2]
        return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"

    def _connect(self) -> None:
        """Open the LISTEN session and the work connection; check the session; LISTEN."""
        self._close_database()
        self.listen = connect(self.config.dsn, "listen")
        self.work = connect(self.config.dsn, "deliver")
        self.listen_pid = check_session(self.listen, self.work)
        self.listen.execute(queries.LISTEN_NOTICES)
        self.database_up = True

    def _check_claim_timeout(self) -> None:
        assert self.work is not None
        self.claim_timeout = self.work.execute(queries.NOTICE_CLAIM_TIMEOUT).fetchone()[0]
        worst = self.config.limit * self.config.timeout
        if worst >= self.claim_timeout:
            raise ConfigError(
                f"--timeout {self.config.timeout:g}s for each of --limit {self.config.limit} "
                f"notices ({worst:g}s) must stay below llm.settings.notice_claim_timeout "
                f"({self.claim_timeout:g}s): a claim would expire while its batch is still "
                "being delivered and the pass would re-arm notices being sent; lower --timeout "
                "or --limit (or raise notice_claim_timeout)"
            )

    def _close_database(self) -> None:
        for conn in (self.listen, self.work):
            if conn is not None:
                with contextlib.suppress(Exception):
                    conn.close()
        self.listen = self.work = None
        self.database_up = False

    def _close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        self._close_database()
        with self._probe_lock:
            if self._probe_conn is not None:
                with contextlib.suppress(Exception):
                    self._probe_conn.close()
                self._probe_conn = None
        self._http.close()

    # --- the loop ----------------------------------------------------------------

    def _loop(self) -> None:
        pause = RECONNECT_PAUSE
        while not self.stopping.is_set():
            try:
                if self.listen is None:
                    self._connect()
                    self.log("reconnected", listen_pid=self.listen_pid)
                    self._release_held()
                    pause = RECONNECT_PAUSE
                self._drain_notifies()
                self._deliver_due()
                if self.stopping.is_set():
                    return
                wait = self._next_wait()
                self._check_same_session()
            except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
                if self.database_up:
                    self.log("database_lost", level="error", error=_one_line(exc),
                             held=len(self.held))  # fmt: skip
                self._close_database()
                wait, pause = pause, min(pause * 2, self.config.poll)
            self._wait(wait)

    def _deliver_due(self) -> None:
        """Claim and deliver batches until one comes back short (or a stop is asked)."""
        assert self.work is not None
        llm = Llm(self.work)
        while not self.stopping.is_set():
            notices = llm.claim_notices(limit=self.config.limit)
            for notice in notices:
                self.held[(notice.organization_id, notice.id)] = notice
            _, unsent = deliver_claimed(
                llm, self._http, self.config.url, self.config.secrets, notices,
                timeout=self.config.timeout, max_attempts_per_run=1,
                should_stop=self.stopping.is_set, on_result=self._delivered,
            )  # fmt: skip
            if unsent or len(notices) < self.config.limit:
                return

    def _delivered(self, notice: Notice, attempt: Attempt, outcome: str, seconds: float) -> None:
        self.held.pop((notice.organization_id, notice.id), None)
        fields = {
            "notice_id": notice.id, "organization_id": notice.organization_id,
            "scope": notice.scope, "window": notice.budget_window,
            "threshold_pct": notice.threshold_pct, "attempt": notice.attempts,
            "ms": round(seconds * 1000, 1),
        }  # fmt: skip
        if notice.scope_id is not None:  # the budget's id; the allowance has none
            fields["scope_id"] = notice.scope_id
        if attempt.status is not None:
            fields["http_status"] = attempt.status
        self.deliveries.labels(outcome=outcome).inc()
        if outcome == "lost":
            self._claim_lost(notice, delivered=attempt.error is None, **fields)
        elif attempt.error is None:
            self.log("delivered", **fields)
        else:
            self.log("failed", level="warning", error=attempt.error, **fields)

    def _claim_lost(self, notice: Notice, **fields: Any) -> None:
        """Its claim expired and another worker claimed the notice again: this worker's
        complete, fail or release changed nothing (that worker's claim stands)."""
        fields.setdefault("notice_id", notice.id)
        fields.setdefault("organization_id", notice.organization_id)
        self.log("claim_lost", level="warning",
                 hint="the claim outlived notice_claim_timeout; the pass re-armed it", **fields)  # fmt: skip

    def _release_held(self) -> int:
        """Release every notice this process still holds; how many are left sending."""
        if not self.held:
            return 0
        try:
            if self.work is None:
                raise psycopg.OperationalError("no database connection")
            llm = Llm(self.work)
            for key, notice in list(self.held.items()):
                released = llm.release_notice(notice.organization_id, notice.id, notice.claim_token)
                del self.held[key]
                if released:
                    self.deliveries.labels(outcome="released").inc()
                    self.log("released", notice_id=notice.id,
                             organization_id=notice.organization_id)  # fmt: skip
                else:
                    self.deliveries.labels(outcome="lost").inc()
                    self._claim_lost(notice)
        except psycopg.Error as exc:
            self.log("release_failed", level="error", error=_one_line(exc), left=len(self.held),
                     hint="the hourly pass re-arms them after notice_claim_timeout")  # fmt: skip
        return len(self.held)

    def _next_wait(self) -> float:
        """Seconds until the next owed notice is due, at most ``poll``."""
        assert self.work is not None
        due = self.work.execute(queries.NEXT_NOTICE_DUE).fetchone()[0]
        return self.config.poll if due is None else min(self.config.poll, due)

    def _check_same_session(self) -> None:
        assert self.listen is not None
        pid = _backend_pid(self.listen)
        if pid != self.listen_pid:
            raise SessionRequired(
                f"the LISTEN session's server backend changed ({self.listen_pid}, then {pid}): "
                "connect --dsn directly to PostgreSQL, or through PgBouncer in session mode"
            )

    def _drain_notifies(self) -> None:
        if self.listen is not None:
            for _ in self.listen.notifies(timeout=0):
                pass

    def _wait(self, seconds: float) -> None:
        """Sleep up to ``seconds``: a NOTIFY on llm_notices or a stop ends it early."""
        deadline = time.monotonic() + seconds
        while not self.stopping.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            step = min(WAIT_SLICE, remaining)
            if self.listen is None:
                self.stopping.wait(step)
                continue
            try:
                for _ in self.listen.notifies(timeout=step, stop_after=1):
                    return
            except (psycopg.OperationalError, psycopg.InterfaceError):
                return  # the loop notices and reconnects

    # --- /metrics and /healthz ---------------------------------------------------

    @contextlib.contextmanager
    def _probe(self) -> Iterator[psycopg.Connection]:
        """The endpoints' own connection (never the delivery loop's), reopened when lost."""
        with self._probe_lock:
            conn = self._probe_conn
            if conn is None or conn.closed or conn.broken:
                self._probe_conn = conn = connect(
                    self.config.dsn, "metrics", connect_timeout=5,
                    options="-c statement_timeout=10s -c lock_timeout=5s",
                )  # fmt: skip
            try:
                yield conn
            except psycopg.OperationalError:
                with contextlib.suppress(Exception):
                    conn.close()
                self._probe_conn = None
                raise

    def metrics_text(self) -> bytes:
        from llm_db.service.metrics import scrape

        return scrape(self._probe, extra=[self.deliveries]).text

    def healthz(self) -> tuple[int, dict[str, Any]]:
        """(HTTP status, body): 200 when the database answers and the pass is healthy."""
        try:
            with self._probe() as conn:
                health = Llm(conn).health()
        except psycopg.Error as exc:
            return 503, {"status": "unavailable", "database": "down", "error": _one_line(exc)}
        body = {
            "status": "ok", "database": "up", "reconciliation": health.status,
            "detail": health.detail, "delivery_loop": "up" if self.database_up else "reconnecting",
        }  # fmt: skip
        if health.status != "ok":
            return 503, {**body, "status": "unhealthy"}
        return 200, body

    def _serve(self) -> None:
        worker = self

        class Handler(http.server.BaseHTTPRequestHandler):
            server_version = "llm-db-worker"

            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    from prometheus_client import CONTENT_TYPE_LATEST

                    self._send(200, worker.metrics_text(), CONTENT_TYPE_LATEST)
                elif path == "/healthz":
                    status, body = worker.healthz()
                    self._send(status, json.dumps(body).encode() + b"\n", "application/json")
                else:
                    self._send(404, b"not found: try /metrics or /healthz\n", "text/plain")

            def _send(self, status: int, body: bytes, content_type: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        host, port = self.config.metrics_addr

        class Server(http.server.ThreadingHTTPServer):
            address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
            daemon_threads = True

        try:
            server = Server((host, port), Handler)
        except OSError as exc:
            raise ConfigError(f"cannot listen on --metrics-addr {host}:{port}: {exc}") from exc
        self._server = server
        threading.Thread(target=server.serve_forever, name="llm-db worker http",
                         daemon=True).start()  # fmt: skip
