"""Every SQL statement the benchmark runs, once, by name.

Bulk loads are set-based ``INSERT … SELECT generate_series`` straight into the
``llm`` tables, written so the books stay consistent (``llm.check_invariants()``
returns nothing after each load): a period's ``used``/``held`` are the sums of
its invocations, each invocation has its hold, release and charge ledger rows,
an execution's totals are the sums over its terminal invocations.

Ids are deterministic where a client must find them again without a lookup
(``md5('bench-org-' || n)::uuid`` for organization n, ``md5('bench-exec-' || n)``
for its running task), random (``gen_random_uuid()``) for invocations, as
real clients send them.
"""

# ------------------------------------------------------------- identities

ORG_ID = "md5('bench-org-' || {n})::uuid"
EXEC_ID = "md5('bench-exec-' || {n})::uuid"

TASK_KIND = "SELECT llm.declare_task_kind('bench', 'benchmark task')"

# ------------------------------------------------------------- organizations

# Organizations 1..n through the public function (it is cheap at this size).
UPSERT_ORGS = f"""
SELECT count(*) FROM generate_series(1, %(orgs)s::integer) AS n,
       LATERAL llm.upsert_organization({ORG_ID.format(n="n")}, 'bench org ' || n,
                                       %(allowance)s::bigint) AS o
"""

# Running tasks of each organization, one per client slot (0..slots-1), as
# open_execution leaves them (a direct insert so the id is the deterministic
# md5('bench-exec-' || n || '-' || slot) the clients compute): a tenant's agents
# each run their own task, so one organization's clients do not queue on one task row.
TASK_ID = "md5('bench-exec-' || {n} || '-' || {slot})::uuid"
OPEN_TASKS = f"""
INSERT INTO llm.executions (organization_id, id, task_key, status, started_at)
SELECT {ORG_ID.format(n="n")}, {TASK_ID.format(n="n", slot="c")}, 'bench', 'running',
       %(started_at)s::timestamptz
  FROM generate_series(1, %(orgs)s::integer) AS n, generate_series(0, %(slots)s::integer - 1) AS c
"""

# Organization n's period counters spread over this many stripes.
SET_STRIPES = f"SELECT llm.set_period_stripes({ORG_ID.format(n='%(n)s::integer')}, %(stripes)s::integer)"
# Organization n's API keys' day budget ('*') spread over this many stripes.
SET_KEY_STRIPES = (f"SELECT llm.set_budget_stripes({ORG_ID.format(n='%(n)s::integer')}, 'api_key', '*', 'day',"
                   " %(stripes)s::integer)")

# Every request of organizations first .. first + orgs - 1 under two budgets besides
# its allowance: its project's month and its API key's day, each the organization's
# '*' default, so every id a request names gets a counter of its own.
# The price book of priced.sql: one model with a book price (claude-sonnet-4's rates)
# and a credit rate of a micro-dollar, in force since a day before the run.
SET_PRICES = """
SELECT llm.set_price('bench-priced', '{"input": "3", "cache_read": "0.30", "output": "15"}',
                     now() - interval '1 day'),
       llm.set_credit_rate(1000, NULL, now() - interval '1 day')
"""

SET_BUDGETS = f"""
SELECT count(*) FROM generate_series(%(first)s::integer, %(first)s::integer + %(orgs)s::integer - 1) AS n,
       LATERAL (VALUES ('project', 'month'), ('api_key', 'day')) AS b(scope, budget_window),
       LATERAL llm.set_budget({ORG_ID.format(n="n")}, b.scope, '*', b.budget_window, %(limit)s::bigint) AS s
"""

# The budgets of those organizations taken off their rows (NULL, as an organization with
# an own budget of an id keeps them, or one upgraded before 0.4.0's contract step 0029),
# so that admission reads llm.budget_limits; and put back as they were (the same
# revisions: invariant 21 holds again). Run as the benchmark's superuser.
UNIFORM_BUDGETS_OFF = """
CREATE TABLE public.bench_uniform_budgets AS
SELECT o.id, o.uniform_budget_mask, o.uniform_budget_limits, o.uniform_budget_revisions
  FROM llm.organizations AS o WHERE o.uniform_budget_mask IS NOT NULL;
UPDATE llm.organizations AS o
   SET uniform_budget_mask = NULL, uniform_budget_limits = NULL, uniform_budget_revisions = NULL
  FROM public.bench_uniform_budgets AS u WHERE u.id = o.id
"""
UNIFORM_BUDGETS_ON = """
UPDATE llm.organizations AS o
   SET uniform_budget_mask = u.uniform_budget_mask, uniform_budget_limits = u.uniform_budget_limits,
       uniform_budget_revisions = u.uniform_budget_revisions
  FROM public.bench_uniform_budgets AS u WHERE u.id = o.id;
DROP TABLE public.bench_uniform_budgets
"""

# One request admitted and settled per project id of each of those organizations (and
# per key id, keys cycling), as budgets.sql names them: every counter a timed run moves
# exists already, as in a service whose ids have each made a request that day.
PREFILL_COUNTERS = f"""
SELECT count(llm.settle_invocation({ORG_ID.format(n="n")}, a.id, 80, 3, 1200, 300))
  FROM generate_series(%(first)s::integer, %(first)s::integer + %(orgs)s::integer - 1) AS n,
       generate_series(1, greatest(%(projects)s::integer, %(keys)s::integer)) AS i,
       LATERAL llm.admit_invocation({ORG_ID.format(n="n")}, 100, 'bench-model', {TASK_ID.format(n="n", slot="0")},
                                    gen_random_uuid(), p_project => 'project-' || ((i - 1) %% %(projects)s + 1),
                                    p_api_key => 'key-' || n || '-' || ((i - 1) %% %(keys)s + 1)) AS a
"""

# Organizations straight into the table (thousands of them).
INSERT_ORGS = f"""
INSERT INTO llm.organizations (id, name, status, monthly_allowance_credits, created_at, updated_at)
SELECT {ORG_ID.format(n="n")}, 'bench org ' || n, 'operational', %(allowance)s::bigint,
       %(now)s::timestamptz - interval '400 days', %(now)s::timestamptz - interval '400 days'
  FROM generate_series(1, %(orgs)s::integer) AS n
"""

# ------------------------------------------------------------- settled history

# A staging table for one slice of history; the slice is then copied into the
# llm tables with every derived figure computed from it, so the books agree.
HISTORY_STAGE = """
CREATE TEMP TABLE IF NOT EXISTS bench_history (
    organization_id uuid, execution_id uuid, id uuid, period_start date, model text,
    status text, estimate bigint, charged bigint, cents bigint,
    input_tokens bigint, output_tokens bigint, created_at timestamptz, settled_at timestamptz)
"""
HISTORY_CLEAR = "TRUNCATE bench_history"

# Request g (first <= g < last) is settled at `end - g * step` seconds (so a
# longer history reaches further back at the same request rate), belongs to
# organization (g / per_task) %% orgs + 1 and, with `tasks`, to its task
# g / per_task; one in fifty failed with nothing charged.
HISTORY_FILL = """
INSERT INTO bench_history
SELECT md5('bench-org-' || ((g / %(per_task)s) %% %(orgs)s + 1))::uuid,
       CASE WHEN %(tasks)s::boolean THEN md5(%(task_prefix)s::text || (g / %(per_task)s))::uuid END,
       gen_random_uuid(),
       date_trunc('month', (c.t - interval '3 seconds') AT TIME ZONE 'UTC')::date,  -- its admission's month
       (ARRAY['model-a', 'model-b', 'model-c'])[g %% 3 + 1],
       CASE WHEN g %% 50 = 0 THEN 'failed' ELSE 'settled' END,
       100 + g %% 50,
       CASE WHEN g %% 50 = 0 THEN 0 ELSE 40 + g %% 90 END,
       CASE WHEN g %% 50 = 0 THEN 0 ELSE (40 + g %% 90) / 10 END,
       500 + g %% 700, 100 + g %% 300,
       c.t - interval '3 seconds', c.t
  FROM generate_series(%(first)s::bigint, %(last)s::bigint - 1) AS g
 CROSS JOIN LATERAL (SELECT %(end)s::timestamptz - g * %(step)s::double precision
                                                   * interval '1 second' AS t) AS c
"""

# A period is its head (allowance) and its stripes (counters); the loads put every
# counter on stripe 0, rooms 0 (the next movement spreads them), as schema 0007
# converts an existing period: no open request, the settle lag of a settlement 3 s
# after its admission (1 hour, rounded up), quiet once its month is over.
HISTORY_PERIODS = """
WITH heads AS (
    INSERT INTO llm.period_heads AS p (organization_id, period_start, period_end, allowance_credits)
    SELECT DISTINCT h.organization_id, h.period_start, (h.period_start + interval '1 month')::date,
           o.monthly_allowance_credits
      FROM bench_history AS h JOIN llm.organizations AS o ON o.id = h.organization_id
    ON CONFLICT (organization_id, period_start) DO NOTHING
)
INSERT INTO llm.period_stripes AS s (organization_id, period_start, stripe, used_credits, used_cents,
                                     admit_room, notice_room, open_requests, open_since, quiet,
                                     settle_lag_hours, settle_lead_hours)
SELECT h.organization_id, h.period_start, 0, sum(h.charged), sum(h.cents),
       CASE WHEN o.monthly_allowance_credits IS NOT NULL THEN 0 END,
       CASE WHEN o.monthly_allowance_credits IS NOT NULL THEN 0 END,
       0, NULL, h.period_start + interval '1 month' <= now(), 1, 0
  FROM bench_history AS h JOIN llm.organizations AS o ON o.id = h.organization_id
 GROUP BY h.organization_id, h.period_start, o.monthly_allowance_credits
ON CONFLICT (organization_id, period_start, stripe) DO UPDATE
   SET used_credits = s.used_credits + excluded.used_credits,
       used_cents = s.used_cents + excluded.used_cents
"""

HISTORY_TASKS = """
INSERT INTO llm.executions (organization_id, id, task_key, status, started_at, ended_at,
                            duration_ms, request_count, credits, cents)
SELECT h.organization_id, h.execution_id, 'bench', 'completed',
       min(h.created_at) - interval '1 second', max(h.settled_at) + interval '1 second',
       (extract(epoch FROM max(h.settled_at) - min(h.created_at)) * 1000)::bigint + 2000,
       count(*), sum(h.charged), sum(h.cents)
  FROM bench_history AS h
 WHERE h.execution_id IS NOT NULL
 GROUP BY h.organization_id, h.execution_id
"""

HISTORY_INVOCATIONS = """
INSERT INTO llm.invocations (organization_id, id, period_start, execution_id, model, status,
                             estimate_credits, hold_credits, charged_credits, charged_cents,
                             input_tokens, output_tokens, settlement_kind, created_at,
                             dispatched_at, settled_at, error, budget_mask)
SELECT h.organization_id, h.id, h.period_start, h.execution_id, h.model, h.status,
       h.estimate, h.estimate, h.charged, h.cents,
       h.input_tokens, h.output_tokens,
       CASE h.status WHEN 'settled' THEN 'measured' END,
       h.created_at, h.created_at + interval '10 milliseconds', h.settled_at,
       CASE h.status WHEN 'failed' THEN 'bench: provider error' END, 0
  FROM bench_history AS h
 ORDER BY h.organization_id, h.id
"""

# ------------------------------------------------------------- stranded requests

# Request g of organization g %% orgs + 1, admitted between 25 h and ~30 h
# before `now` and never settled (half reserved, half dispatched, three in four
# linked to the organization's task, which has been running for four days).
# The allowance is 150 credits a request: recovering all of them takes an
# organization past its 80 %% notice threshold.
STRANDED_ORGS = f"""
INSERT INTO llm.organizations (id, name, status, monthly_allowance_credits, created_at, updated_at)
SELECT {ORG_ID.format(n="n")}, 'bench org ' || n, 'operational', 150 * %(per_org)s::bigint,
       %(now)s::timestamptz - interval '400 days', %(now)s::timestamptz - interval '400 days'
  FROM generate_series(1, %(orgs)s::integer) AS n
"""

STRANDED_TASKS = f"""
INSERT INTO llm.executions (organization_id, id, task_key, status, started_at)
SELECT {ORG_ID.format(n="n")}, {EXEC_ID.format(n="n")}, 'bench', 'running',
       %(now)s::timestamptz - interval '4 days'
  FROM generate_series(1, %(orgs)s::integer) AS n
"""

STRANDED_STAGE = """
CREATE TEMP TABLE bench_stranded AS
SELECT md5('bench-org-' || (g %% %(orgs)s + 1))::uuid AS organization_id,
       CASE WHEN g %% 4 <> 0 THEN md5('bench-exec-' || (g %% %(orgs)s + 1))::uuid END AS execution_id,
       gen_random_uuid() AS id,
       date_trunc('month', c.t AT TIME ZONE 'UTC')::date AS period_start,
       CASE WHEN g %% 2 = 0 THEN 'reserved' ELSE 'dispatched' END AS status,
       (100 + g %% 50)::bigint AS estimate,
       c.t AS created_at
  FROM generate_series(0, %(orgs)s::bigint * %(per_org)s - 1) AS g
 CROSS JOIN LATERAL (SELECT %(now)s::timestamptz - interval '25 hours'
                            - (g / %(orgs)s) * interval '90 seconds' AS t) AS c
"""

STRANDED_PERIODS = """
WITH heads AS (
    INSERT INTO llm.period_heads (organization_id, period_start, period_end, allowance_credits)
    SELECT DISTINCT s.organization_id, s.period_start, (s.period_start + interval '1 month')::date,
           o.monthly_allowance_credits
      FROM bench_stranded AS s JOIN llm.organizations AS o ON o.id = s.organization_id
)
INSERT INTO llm.period_stripes (organization_id, period_start, stripe, held_credits, admit_room, notice_room,
                                open_requests, open_since, quiet, settle_lag_hours, settle_lead_hours)
SELECT s.organization_id, s.period_start, 0, sum(s.estimate),
       CASE WHEN o.monthly_allowance_credits IS NOT NULL THEN 0 END,
       CASE WHEN o.monthly_allowance_credits IS NOT NULL THEN 0 END,
       count(*), min(s.created_at), false, 0, 0
  FROM bench_stranded AS s JOIN llm.organizations AS o ON o.id = s.organization_id
 GROUP BY s.organization_id, s.period_start, o.monthly_allowance_credits
"""

STRANDED_INVOCATIONS = """
INSERT INTO llm.invocations (organization_id, id, period_start, execution_id, model, status,
                             estimate_credits, hold_credits, created_at, dispatched_at, budget_mask)
SELECT s.organization_id, s.id, s.period_start, s.execution_id, 'model-a', s.status,
       s.estimate, s.estimate, s.created_at,
       CASE s.status WHEN 'dispatched' THEN s.created_at + interval '10 milliseconds' END, 0
  FROM bench_stranded AS s
"""

STRANDED_LEFT = """
SELECT count(*) FROM llm.invocations AS i
 WHERE i.status IN ('reserved', 'dispatched')
   AND i.created_at <= %(now)s::timestamptz - (SELECT s.recovery_window FROM llm.settings AS s)
"""

# The baseline: the same rows settled by one bare statement, with none of the
# books (no ledger, no period, no task, no notices, no per-organization commit).
BARE_RECOVERY_UPDATE = """
UPDATE llm.invocations AS i
   SET status = 'settled', settlement_kind = 'recovered', settled_at = %(now)s::timestamptz,
       charged_credits = i.estimate_credits, charged_cents = NULL,
       past_window_alerted_at = coalesce(i.past_window_alerted_at, %(now)s::timestamptz)
 WHERE i.status IN ('reserved', 'dispatched')
   AND i.created_at <= %(now)s::timestamptz - (SELECT s.recovery_window FROM llm.settings AS s)
"""

# ------------------------------------------------------------- the pass

RUN_PASS = "CALL llm.run_reconciliation(p_now => %(now)s::timestamptz)"

# Every organization due for its audit at the next pass (as after an upgrade).
AUDIT_EVERYONE = "UPDATE llm.sweep_totals SET audit_due_at = NULL"

# The audit's outcome: findings (none expected: the loads keep the books right) and how
# many organizations have been audited.
AUDIT_STATE = """
SELECT (SELECT count(*) FROM llm.period_findings) AS findings,
       (SELECT count(*) FROM llm.sweep_totals WHERE audited_at >= %(clock)s::timestamptz) AS audited
"""

LAST_RUN = """
SELECT r.status, r.orgs_visited, r.orgs_failed, r.requests_recovered, r.executions_abandoned,
       r.drift_findings, r.more_pending_orgs, r.daily_rows_rebuilt,
       extract(epoch FROM r.finished_at - r.started_at)::float8 AS seconds, r.errors
  FROM llm.reconciliation_runs AS r
 WHERE r.status <> 'skipped'
 ORDER BY r.started_at DESC
 LIMIT 1
"""

WAL_LSN = "SELECT pg_current_wal_insert_lsn()::text"
WAL_BYTES_SINCE = "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), %(lsn)s::pg_lsn)::bigint"

# The drift check of one organization, as llm._refresh_drift runs it, for EXPLAIN.
DRIFT_QUERY = """
SELECT x.id, x.request_count, x.credits, x.cents, s.n, s.credits, s.cents
  FROM llm.executions AS x
  LEFT JOIN LATERAL (
        SELECT count(*) AS n, sum(i.charged_credits)::bigint AS credits,
               sum(coalesce(i.charged_cents, 0))::bigint AS cents
          FROM llm.invocations AS i
         WHERE i.organization_id = x.organization_id AND i.execution_id = x.id
           AND i.status IN ('settled', 'failed')) AS s ON true
 WHERE x.organization_id = {org}
   AND x.status <> 'running'
   AND x.ended_at >= {since}
"""

# ------------------------------------------------------------- checks

INVARIANTS = "SELECT * FROM llm.check_invariants()"

TABLE_SIZES = """
SELECT c.relname, c.reltuples::bigint AS rows, pg_total_relation_size(c.oid) AS bytes
  FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
 WHERE n.nspname = 'llm' AND c.relkind = 'r'
 ORDER BY c.relname
"""
