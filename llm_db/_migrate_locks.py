"""How ``llm_db.migrate`` holds its lock and waits at its barriers: the migrate lock
(transaction-level, polled), and the barrier that waits for every transaction open in
the database to end (docs in ``llm_db.migrate``)."""

from __future__ import annotations

import time

import psycopg

from llm_db._migrate_run import DeadlineReached, _Run

# pg_advisory_lock key shared by every llm-db migrate run: b"llm_db" as a bigint.
MIGRATE_LOCK_KEY = int.from_bytes(b"llm_db", "big")


# The migrate lock, tried (transaction-level); an integer formatted in: no parameters.
_TRY_MIGRATE_LOCK = f"SELECT pg_catalog.pg_try_advisory_xact_lock({int(MIGRATE_LOCK_KEY)})"


def _begin_locked(conn: psycopg.Connection, run: _Run) -> None:
    """Open a transaction on ``conn`` that holds the migrate lock (transaction-level).

    A waiting run polls with ``pg_try_advisory_xact_lock`` between short transactions
    instead of waiting inside one: a backend that waits inside a statement keeps a
    snapshot, and ``CREATE INDEX CONCURRENTLY`` in the holder's migrations (on their
    connection) would wait for that snapshot while the waiter waits for the holder.
    No parameters, so the simple query protocol: no portal keeps a snapshot either.
    The transaction then carries the run's settings, so a database's
    ``idle_in_transaction_session_timeout`` cannot end it while the migrations run.
    """
    pause = 0.02
    while True:
        conn.execute("BEGIN")
        if conn.execute(_TRY_MIGRATE_LOCK).fetchone()[0]:  # type: ignore[arg-type,index]
            conn.execute(run.settings)  # type: ignore[arg-type]
            return
        conn.execute("ROLLBACK")
        if time.monotonic() + pause > run.deadline_at:
            raise DeadlineReached("deadline reached waiting for another llm-db migrate to finish")
        time.sleep(pause)
        pause = min(pause * 2, 0.5)


_BACKEND_PID = "SELECT pg_catalog.pg_backend_pid()"


# The transactions open now in this database, but migrate's own: each holds the lock on
# its virtual transaction id until it ends (pg_locks and pg_stat_activity's pid and
# datname are visible to every role, unlike the other sessions' queries).
_OPEN_TRANSACTIONS = """
SELECT l.virtualxid, l.pid
  FROM pg_catalog.pg_locks AS l
  JOIN pg_catalog.pg_stat_activity AS a ON a.pid = l.pid
 WHERE l.locktype = 'virtualxid' AND l.granted AND a.datname = pg_catalog.current_database()
   AND NOT (l.pid = ANY (%(ours)s))
"""


_STILL_OPEN = """
SELECT l.virtualxid, l.pid, a.state, left(a.query, 200) AS query
  FROM pg_catalog.pg_locks AS l
  LEFT JOIN pg_catalog.pg_stat_activity AS a ON a.pid = l.pid
 WHERE l.locktype = 'virtualxid' AND l.granted AND l.virtualxid = ANY (%(open)s)
 LIMIT 1
"""


BARRIER_POLL = 0.05  # seconds between two looks at the transactions the barrier waits for


def _barrier(conn: psycopg.Connection, ours: list[int], run: _Run, step: str, left_as: str) -> None:
    """Wait until every transaction open now in this database (migrate's own aside) has
    ended: the ones that began before the new functions went live (or before the
    migrations so far committed) may still be running the code they replaced. Past the
    deadline, ``DeadlineReached`` names one; ``left_as`` says what the database is left
    with."""
    open_now = [row[0] for row in conn.execute(_OPEN_TRANSACTIONS, {"ours": ours}).fetchall()]
    while open_now:
        left = conn.execute(_STILL_OPEN, {"open": open_now}).fetchone()
        if left is None:
            return
        if time.monotonic() + BARRIER_POLL > run.deadline_at:
            raise DeadlineReached(
                f"{step}: deadline reached, transaction {left[0]} of pid {left[1]} ({left[2]}, "
                f"query: {left[3]!r}) is still open; {left_as}: "
                "end that session (or wait for it), then run migrate again to finish the upgrade",
                blocker_pid=left[1],
                blocker_query=left[3],
            )
        time.sleep(BARRIER_POLL)


def _barrier_of(dsn: str, conn: psycopg.Connection, run: _Run, step: str, left_as: str) -> None:
    """The barrier for every transaction but ``conn``'s (migrate's own, which holds the
    migrate lock), watched from a connection of its own in autocommit: a query with
    parameters in migrate's transaction would leave a portal, and its snapshot, open
    there, which a later ``CREATE INDEX CONCURRENTLY`` waits for. Backend pids are asked
    of the server (behind a transaction pooler the client's is the pooler's)."""
    ours = conn.execute(_BACKEND_PID).fetchone()[0]  # type: ignore[index]
    with psycopg.connect(dsn, autocommit=True, prepare_threshold=None) as observer:
        own = observer.execute(_BACKEND_PID).fetchone()[0]  # type: ignore[index]
        _barrier(observer, [ours, own], run, step, left_as)
