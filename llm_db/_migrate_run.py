"""How one ``llm_db.migrate`` run reports and retries: its errors, its events, each
step retried on a lock timeout with backoff until the deadline, and the watcher that
names whoever blocked it (docs in ``llm_db.migrate``)."""

from __future__ import annotations

import random
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import psycopg
from psycopg import errors as pg_errors
from psycopg.rows import dict_row


class MigrationError(RuntimeError):
    """A migration or function file failed; the message names the file and the error."""

    def __init__(self, message: str, *, path: Path | None = None) -> None:
        super().__init__(message)
        self.path = path


class DeadlineReached(MigrationError):
    """migrate's deadline passed while a step still waited for a lock; what was
    committed before stays, works with the previous release's functions, and a
    re-run goes on from there. ``blocker_pid`` and ``blocker_query`` name the
    session that held the lock, when the watcher saw it."""

    def __init__(
        self, message: str, *, blocker_pid: int | None = None, blocker_query: str | None = None
    ) -> None:
        super().__init__(message)
        self.blocker_pid = blocker_pid
        self.blocker_query = blocker_query


Event = dict[str, Any]
"""One thing migrate did, for ``on_event``: ``{"event": "start" | "done" | "wait" |
"progress", "step": ..., ...}`` (docs in ``migrate``)."""


# A run's settings, the first statement of each of its transactions (an integer
# formatted in: no parameters, so the simple query protocol sends the three at once).
_SETTINGS = (
    "SET LOCAL lock_timeout = '{lock_timeout_ms}ms'; "
    "SET LOCAL statement_timeout = 0; SET LOCAL idle_in_transaction_session_timeout = 0"
)


_T = TypeVar("_T")


@dataclass
class _Run:
    """One migrate run's bounds, its events, and what the watcher last saw."""

    lock_timeout: float
    deadline_at: float  # time.monotonic()
    on_event: Callable[[Event], None]
    step_name: str = ""
    worker_pid: int | None = None  # the backend whose lock waits the watcher reads
    blocker: dict[str, Any] | None = None  # the watcher's last sighting
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def settings(self) -> str:
        """The statement every transaction of this run starts with."""
        return _SETTINGS.format(lock_timeout_ms=max(1, round(self.lock_timeout * 1000)))

    def emit(self, event: str, **fields: Any) -> None:
        self.on_event({"event": event, "step": self.step_name, **fields})

    def step(self, name: str, work: Callable[[], _T]) -> _T:
        """Run ``work`` (one transaction, or one savepoint) until it does not fail on
        a lock timeout; between attempts, back off exponentially with jitter."""
        self.step_name = name
        started = time.monotonic()
        self.emit("start")
        attempt = 1
        while True:
            with self.lock:
                self.blocker = None
            try:
                result = work()
            except pg_errors.LockNotAvailable:
                with self.lock:
                    seen = dict(self.blocker or {})
                # exponential, with jitter: retries of concurrent runs spread out
                pause = random.uniform(0.5, 1.0) * min(30.0, self.lock_timeout * 2 ** (attempt - 1))
                if time.monotonic() + pause > self.deadline_at:
                    raise DeadlineReached(
                        f"{name}: deadline reached after {attempt} attempts, still waiting for "
                        f"{_who(seen)}; nothing of this step was applied and the database works "
                        "as it is: end that session (or wait for it), then run migrate again",
                        blocker_pid=seen.get("blocker_pid"),
                        blocker_query=seen.get("blocker_query"),
                    ) from None
                self.emit(
                    "wait", attempt=attempt, retry_in_s=round(pause, 3), **_blocker_fields(seen)
                )
                time.sleep(pause)
                attempt += 1
                continue
            self.emit("done", elapsed_s=round(time.monotonic() - started, 3), attempts=attempt)
            return result

    def on_notice(self, diag: psycopg.errors.Diagnostic) -> None:
        """A backfill's ``RAISE NOTICE 'llm-db progress: <done>/<total>'``."""
        found = _PROGRESS.match(diag.message_primary or "")
        if found:
            self.emit("progress", done=int(found[1]), total=int(found[2]))


_PROGRESS = re.compile(r"^llm-db progress: (\d+)/(\d+)$")


def _blocker_fields(seen: dict[str, Any]) -> dict[str, Any]:
    return {k: seen.get(k) for k in ("lock", "mode", "blocker_pid", "blocker_query")}


def _who(seen: dict[str, Any]) -> str:
    if not seen:
        return "a lock (its holder had gone when looked for)"
    lock = f"{seen['mode']} on {seen['lock']}" if seen.get("lock") else seen.get("mode") or "a lock"
    return f"{lock} held by pid {seen['blocker_pid']} (query: {seen['blocker_query']!r})"


# Who blocks the statement migrate is running: its ungranted lock, and the first
# session pg_blocking_pids names, with what that session runs (or ran last).
_BLOCKER = """
SELECT l.relation::regclass::text AS lock, l.mode, b.pid AS blocker_pid,
       left(b.query, 200) AS blocker_query
  FROM pg_catalog.pg_locks AS l,
       LATERAL unnest(pg_catalog.pg_blocking_pids(%(pid)s)) AS bp(pid)
  JOIN pg_catalog.pg_stat_activity AS b ON b.pid = bp.pid
 WHERE l.pid = %(pid)s AND NOT l.granted
 LIMIT 1
"""


class _Watcher:
    """A thread with its own connection that looks, a few times per lock timeout,
    for whoever blocks migrate's working backend, so that a wait cancelled by
    lock_timeout can name its holder afterwards. Best effort: it reads only."""

    def __init__(self, dsn: str, run: _Run) -> None:
        self._dsn, self._run = dsn, run
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._loop, name="llm-db migrate watcher", daemon=True
        )

    def __enter__(self) -> _Watcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)  # a daemon: a query stuck on the network cannot hold migrate

    def _loop(self) -> None:
        interval = min(0.1, self._run.lock_timeout / 5)
        try:
            # no SET: behind a transaction pooler it would outlive this connection
            with psycopg.connect(
                self._dsn, autocommit=True, prepare_threshold=None, row_factory=dict_row
            ) as conn:
                while not self._stop.wait(interval):
                    pid = self._run.worker_pid
                    if pid is None:
                        continue
                    seen = conn.execute(_BLOCKER, {"pid": pid}).fetchone()
                    if seen is not None:
                        with self._run.lock:
                            self._run.blocker = seen
        except psycopg.Error:
            return  # the run goes on; its errors then only lack the holder's name


_RESET = "RESET lock_timeout; RESET statement_timeout; RESET idle_in_transaction_session_timeout"


def _line_of(text: str, exc: psycopg.Error) -> str:
    position = exc.diag.statement_position
    if position and position.isdigit():
        return f" line {text[: int(position)].count(chr(10)) + 1}"
    return ""


def _describe(exc: psycopg.Error) -> str:
    diag = exc.diag
    parts = [f"{diag.sqlstate or '?'} {diag.message_primary or str(exc).strip()}"]
    if diag.message_detail:
        parts.append(f"DETAIL: {diag.message_detail}")
    if diag.context:
        parts.append(f"CONTEXT: {diag.context.strip()}")
    return "\n".join(parts)
