"""The SQL statements the core and the notice worker run besides the operations
(``codegen.operations`` builds each operation's statement from its entry, and the
reads of the report and the metrics are operations too: sql/81, sql/82). The CLI
and the demo use these too. The other components that speak SQL keep theirs, as
named constants, in one module each: ``llm_db.migrate`` (the catalog, the migrate
lock, the migrations' record), ``llm_db.cli.doctor`` (its checks),
``llm_db.cli.commands.setup`` (pg_cron), ``llm_db.demo`` (its books and its
injected fault) and ``llm_db.testing._sql`` (the test server's roles and
databases). docs/architecture.md "Conventions" 6.

Parameters are named (``%(name)s``) and cast explicitly. Rows are read by named
columns, never ``*``: a statement prepared on the server keeps its result when a
table gains a column.
"""

import dataclasses

from llm_db.models import ReconciliationRun

# The server's clock of the transaction: the ``now`` of a read given none.
NOW = "SELECT pg_catalog.now() AS now"

# Whether llm-db is installed in the connected database (named in the error when not):
# asked by ``llm-db schedule``/``unschedule`` and the demo before they use it.
LLM_INSTALLED = """
SELECT pg_catalog.to_regproc('llm.run_reconciliation') IS NOT NULL AS installed,
       pg_catalog.current_database() AS dbname
"""

# ----------------------------------------------------------- the pass (run_reconciliation)

# The server clock before the CALL, to find the run row the CALL recorded.
CLOCK = "SELECT pg_catalog.clock_timestamp() AS clock"

# The newest run that finished since that clock (a pass skipped by an overlapping
# one records its own row).
RUN_RECORDED_SINCE = f"""
SELECT {", ".join(f"r.{field.name}" for field in dataclasses.fields(ReconciliationRun))}
  FROM llm.reconciliation_runs AS r
 WHERE r.started_at >= %(since)s::timestamptz AND r.finished_at IS NOT NULL
 ORDER BY r.started_at DESC
 LIMIT 1
"""

# ----------------------------------------------------------- the notice worker

# The worker sleeps until the next owed notice is due (or a NOTIFY, or --poll):
# seconds from the server's now(), NULL when nothing is owed. The partial index
# threshold_notices_owed answers it.
NEXT_NOTICE_DUE = """
SELECT GREATEST(0, EXTRACT(EPOCH FROM min(n.next_attempt_at) - pg_catalog.now()))::float8 AS seconds
  FROM llm.threshold_notices AS n
 WHERE n.status = 'owed'
"""

# The channel llm._notify_notices_owed signals (sql/15_notices.sql), which the
# worker LISTENs on. A channel is an identifier, never a parameter.
NOTICES_CHANNEL = "llm_notices"
LISTEN_NOTICES = f"LISTEN {NOTICES_CHANNEL}"

# The session a LISTEN holds, compared with another's to detect transaction pooling.
BACKEND_PID = "SELECT pg_catalog.pg_backend_pid() AS pid"

NOTICE_CLAIM_TIMEOUT = """
SELECT EXTRACT(EPOCH FROM s.notice_claim_timeout)::float8 AS seconds FROM llm.settings AS s
"""

# `llm-db prices list`: every price version (one model's with %(model)s), its rates as
# text so that every number is read back as a Decimal, never a float.
PRICE_VERSIONS = """
SELECT p.id, p.model, p.organization_id, p.effective_from, p.currency, p.rates::text AS rates
  FROM llm.prices AS p
 WHERE %(model)s::text IS NULL OR p.model = %(model)s::text
 ORDER BY p.model, p.organization_id NULLS FIRST, p.effective_from
"""

# `llm-db prices import`: the versions there are, to tell one added from one returned.
PRICE_VERSION_IDS = "SELECT p.id FROM llm.prices AS p"
