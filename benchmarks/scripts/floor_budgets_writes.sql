-- floor_budgets.sql without the read of the budgets that apply: the request carries
-- the mask that read finds in the benchmark's database (bits 5 and 6: a project's
-- month, an API key's day; benchmarks/queries.py SET_BUDGETS), and the counters move
-- as there. With floor_budgets_read.sql, it splits what three budgets add to the
-- floor into their writes and their read (benchmarks/floors.py).
\set n random(:first, :first + :norgs - 1)
\set slot :client_id % 8
\set p random(1, :nprojects)
\set k random(1, :nkeys)
WITH o AS (
    SELECT o.status, o.budgets_revision FROM llm.organizations AS o WHERE o.id = md5('bench-org-' || :n)::uuid
), x AS (
    SELECT x.status FROM llm.executions AS x
     WHERE x.organization_id = md5('bench-org-' || :n)::uuid AND x.id = md5('bench-exec-' || :n || '-' || :slot)::uuid
), i AS (
    INSERT INTO llm.invocations AS i
           (organization_id, id, period_start, execution_id, model, status, estimate_credits, hold_credits,
            created_at, stripe, project, api_key, budget_mask, budget_stripe)
    SELECT md5('bench-org-' || :n)::uuid, gen_random_uuid(), llm._period_start(now()),
           md5('bench-exec-' || :n || '-' || :slot)::uuid, 'bench-model', 'reserved', 100, 100, now(), 0,
           'project-' || :p, 'key-' || :n || '-' || :k, 96, pg_backend_pid() % 64
      FROM o, x WHERE o.status = 'operational' AND x.status = 'running'
    RETURNING i.id, i.period_start, i.created_at, i.budget_stripe
), s AS (
    UPDATE llm.period_stripes AS s
       SET held_credits = s.held_credits + 100, admit_room = s.admit_room - 100,
           open_requests = s.open_requests + 1, open_since = llm._open_since(s.open_requests, s.open_since, 1, now()),
           quiet = false
      FROM i
     WHERE s.organization_id = md5('bench-org-' || :n)::uuid AND s.period_start = i.period_start AND s.stripe = 0
       AND s.admit_room >= 100
), c AS (
    UPDATE llm.budget_counters AS c
       SET held_credits = c.held_credits + 100,
           (admit_room, notice_room, cents_room, rooms_revision) =
               (SELECT * FROM (VALUES (c.admit_room - 100, c.notice_room, c.cents_room, c.rooms_revision)) AS r
                 WHERE c.rooms_revision = o.budgets_revision AND c.admit_room >= 100)
      FROM i, o, (VALUES ('project', 'project-' || :p, 'month'), ('api_key', 'key-' || :n || '-' || :k, 'day'))
             AS k (scope, scope_id, budget_window)
     WHERE c.organization_id = md5('bench-org-' || :n)::uuid AND c.scope = k.scope AND c.scope_id = k.scope_id
       AND c.budget_window = k.budget_window AND c.window_start = llm._window_start(k.budget_window, i.created_at)
       AND c.stripe = i.budget_stripe % c.stripes
)
SELECT i.id AS inv FROM i \gset
WITH i AS (
    UPDATE llm.invocations AS i
       SET status = 'settled', settlement_kind = 'measured', settled_at = now(), charged_credits = 80,
           charged_cents = 3, input_tokens = 1200, output_tokens = 300
     WHERE i.organization_id = md5('bench-org-' || :n)::uuid AND i.id = :inv::uuid
       AND i.status IN ('reserved', 'dispatched')
    RETURNING i.execution_id, i.period_start, i.created_at, i.budget_stripe
), o AS (
    SELECT o.budgets_revision FROM llm.organizations AS o WHERE o.id = md5('bench-org-' || :n)::uuid
), x AS (
    UPDATE llm.executions AS x
       SET request_count = x.request_count + 1, credits = x.credits + 80, cents = x.cents + 3
      FROM i WHERE x.organization_id = md5('bench-org-' || :n)::uuid AND x.id = i.execution_id
), s AS (
    UPDATE llm.period_stripes AS s
       SET used_credits = s.used_credits + 80, held_credits = s.held_credits - 100, used_cents = s.used_cents + 3,
           cents_room = s.cents_room - 3, notice_room = s.notice_room - 80,
           open_requests = s.open_requests - 1, open_since = llm._open_since(s.open_requests, s.open_since, -1, now()),
           settle_lag_hours = GREATEST(s.settle_lag_hours, llm._hours_up(now() - i.created_at)),
           settle_lead_hours = GREATEST(s.settle_lead_hours, llm._hours_up(i.created_at - now()))
      FROM i
     WHERE s.organization_id = md5('bench-org-' || :n)::uuid AND s.period_start = i.period_start AND s.stripe = 0
       AND s.cents_room >= 3 AND (s.notice_room IS NULL OR s.notice_room > 80)
)
UPDATE llm.budget_counters AS c
   SET used_credits = c.used_credits + 80, held_credits = c.held_credits - 100, used_cents = c.used_cents + 3,
       (admit_room, notice_room, cents_room, rooms_revision) =
           (SELECT * FROM (VALUES (c.admit_room, c.notice_room - 80, c.cents_room - 3, c.rooms_revision)) AS r
             WHERE c.rooms_revision = o.budgets_revision AND c.cents_room >= 3
               AND (c.notice_room IS NULL OR c.notice_room > 80))
  FROM i, o, (VALUES ('project', 'project-' || :p, 'month'), ('api_key', 'key-' || :n || '-' || :k, 'day'))
         AS k (scope, scope_id, budget_window)
 WHERE c.organization_id = md5('bench-org-' || :n)::uuid AND c.scope = k.scope AND c.scope_id = k.scope_id
   AND c.budget_window = k.budget_window AND c.window_start = llm._window_start(k.budget_window, i.created_at)
   AND c.stripe = i.budget_stripe % c.stripes;
