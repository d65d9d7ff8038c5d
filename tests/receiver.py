"""A webhook receiver on 127.0.0.1 for the delivery, CLI and worker tests: verifies every
POST the way a real receiver would, with the ``standardwebhooks`` package, and keeps what it
got.

Bound at once but listening only after ``up()`` (until then a connection is refused, as
from a receiver that is down). ``status`` and ``headers_out`` choose the answer (401 when
the signature does not verify); ``delay`` slows each answer (released early at ``close()``);
clearing ``block`` holds every answer until it is set again (a worker stays mid-POST). A
context manager: ``with Receiver(secret) as hook`` closes it at the end.
"""

from __future__ import annotations

import dataclasses
import http.server
import threading
import time
from typing import Any

import standardwebhooks


@dataclasses.dataclass(frozen=True)
class Received:
    path: str
    body: bytes
    headers: dict[str, str]  # names lower-cased
    verified: bool
    error: str | None
    arrived: float  # time.monotonic() when the body was read


class Receiver:
    def __init__(self, secret: str, status: int = 204) -> None:
        receiver = self
        self.webhook = standardwebhooks.Webhook(secret)
        self.status = status
        self.delay = 0.0
        self.headers_out: dict[str, str] = {}
        self.release = threading.Event()  # set at close: a delayed answer goes at once
        self.block = threading.Event()
        self.block.set()
        self.received: list[Received] = []
        self._arrivals = threading.Condition()

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as a real receiver

            def do_POST(self) -> None:  # noqa: N802 - the http.server protocol
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                arrived = time.monotonic()
                headers = {k.lower(): v for k, v in self.headers.items()}
                try:
                    receiver.webhook.verify(body, headers)
                    verified, error = True, None
                except standardwebhooks.WebhookVerificationError as exc:
                    verified, error = False, str(exc)
                with receiver._arrivals:
                    receiver.received.append(
                        Received(self.path, body, headers, verified, error, arrived)
                    )
                    receiver._arrivals.notify_all()
                receiver.block.wait(timeout=60)
                if receiver.delay:
                    receiver.release.wait(receiver.delay)
                try:
                    self.send_response(receiver.status if verified else 401)
                    for name, value in receiver.headers_out.items():
                        self.send_header(name, value)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                except OSError:
                    pass  # the worker is gone (killed) or gave up

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(
            ("127.0.0.1", 0), Handler, bind_and_activate=False
        )
        self.server.daemon_threads = True
        self.server.server_bind()  # bound, not listening: connections are refused
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/llm"
        self.thread: threading.Thread | None = None

    def up(self) -> None:
        self.server.server_activate()
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()

    def wait_for(self, count: int, timeout: float) -> list[Received]:
        """The first ``count`` deliveries, once they arrived (AssertionError after ``timeout``)."""
        deadline = time.monotonic() + timeout
        with self._arrivals:
            while len(self.received) < count:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(
                        f"{len(self.received)} of {count} deliveries within {timeout} s"
                    )
                self._arrivals.wait(remaining)
            return self.received[:count]

    def __enter__(self) -> Receiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.release.set()
        self.block.set()
        if self.thread is not None:
            self.server.shutdown()
            self.thread.join(timeout=10)
        self.server.server_close()
