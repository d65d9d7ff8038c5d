-- floor.sql's rows and reads on the organizations with budgets, plus the read of the
-- budgets that apply and of the organization's budgets revision as floor_budgets.sql
-- reads them (a request is booked only when they are found, so the read cannot be
-- skipped), and no counter moved: the request carries no budget (mask 0), so the
-- books stay exact. With floor_budgets_writes.sql, it splits what three budgets add to
-- the floor into their read and their writes (benchmarks/floors.py).
\set n random(:first, :first + :norgs - 1)
\set p random(1, :nprojects)
\set k random(1, :nkeys)
\set slot :client_id % 8
WITH o AS (
    SELECT o.status, o.budgets_revision FROM llm.organizations AS o WHERE o.id = md5('bench-org-' || :n)::uuid
), x AS (
    SELECT x.status FROM llm.executions AS x
     WHERE x.organization_id = md5('bench-org-' || :n)::uuid AND x.id = md5('bench-exec-' || :n || '-' || :slot)::uuid
), b AS (
    SELECT coalesce(sum(1 << a.slot), 0) AS mask
      FROM (SELECT DISTINCT ON (b.scope, b.budget_window) llm._budget_slot(b.scope, b.budget_window) AS slot
              FROM llm.budget_limits AS b
             WHERE b.organization_id = md5('bench-org-' || :n)::uuid
               AND (b.scope = 'organization'
                    OR (b.scope = 'project' AND b.scope_id IN ('project-' || :p, '*'))
                    OR (b.scope = 'api_key' AND b.scope_id IN ('key-' || :n || '-' || :k, '*')))
             ORDER BY b.scope, b.budget_window, b.scope_id = '*') AS a
), i AS (
    INSERT INTO llm.invocations AS i
           (organization_id, id, period_start, execution_id, model, status, estimate_credits, hold_credits,
            created_at, stripe, budget_mask)
    SELECT md5('bench-org-' || :n)::uuid, gen_random_uuid(), llm._period_start(now()),
           md5('bench-exec-' || :n || '-' || :slot)::uuid, 'bench-model', 'reserved', 100, 100, now(), 0, 0
      FROM o, x, b WHERE o.status = 'operational' AND x.status = 'running' AND b.mask > 0
    RETURNING i.id, i.period_start
), s AS (
    UPDATE llm.period_stripes AS s
       SET held_credits = s.held_credits + 100, admit_room = s.admit_room - 100,
           open_requests = s.open_requests + 1, open_since = llm._open_since(s.open_requests, s.open_since, 1, now()),
           quiet = false
      FROM i
     WHERE s.organization_id = md5('bench-org-' || :n)::uuid AND s.period_start = i.period_start AND s.stripe = 0
       AND s.admit_room >= 100
)
SELECT i.id AS inv FROM i \gset
WITH i AS (
    UPDATE llm.invocations AS i
       SET status = 'settled', settlement_kind = 'measured', settled_at = now(), charged_credits = 80,
           charged_cents = 3, input_tokens = 1200, output_tokens = 300
     WHERE i.organization_id = md5('bench-org-' || :n)::uuid AND i.id = :inv::uuid
       AND i.status IN ('reserved', 'dispatched')
    RETURNING i.execution_id, i.period_start, i.created_at
), x AS (
    UPDATE llm.executions AS x
       SET request_count = x.request_count + 1, credits = x.credits + 80, cents = x.cents + 3
      FROM i WHERE x.organization_id = md5('bench-org-' || :n)::uuid AND x.id = i.execution_id
)
UPDATE llm.period_stripes AS s
   SET used_credits = s.used_credits + 80, held_credits = s.held_credits - 100, used_cents = s.used_cents + 3,
       cents_room = s.cents_room - 3, notice_room = s.notice_room - 80,
       open_requests = s.open_requests - 1, open_since = llm._open_since(s.open_requests, s.open_since, -1, now()),
       settle_lag_hours = GREATEST(s.settle_lag_hours, llm._hours_up(now() - i.created_at)),
       settle_lead_hours = GREATEST(s.settle_lead_hours, llm._hours_up(i.created_at - now()))
  FROM i
 WHERE s.organization_id = md5('bench-org-' || :n)::uuid AND s.period_start = i.period_start AND s.stripe = 0
   AND s.cents_room >= 3 AND (s.notice_room IS NULL OR s.notice_room > 80);
