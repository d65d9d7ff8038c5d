-- The floor of budgets.sql's cycle: floor.sql's rows and reads, plus what three
-- budgets (the allowance, its project's month, its API key's day) add to them: the
-- read of the budgets that apply (llm.budget_limits, as llm._applicable_budgets reads
-- it) and the organization's budgets revision, then each counter moved on the
-- request's stripe, by its key, at admission and at settlement, its columns as
-- llm._move_within_counter_rooms moves them. A counter is moved whether or not its
-- rooms hold the move; rooms that do not (or are of another revision) are unset, all
-- four columns, as the pass unsets them, and the next real call takes the exact path:
-- the floor counts every request it books, so the invariants hold after it (moved
-- only within its rooms, it booked requests it did not count whenever a stripe's
-- rooms were unset, and invariant 14 said so in a full run at 15fcdb9). Plain SQL, no check and no PL/pgSQL. Variables as budgets.sql. It creates no
-- counter: it moves those benchmarks/queries.py PREFILL_COUNTERS made for the day of
-- the run (run across midnight UTC, its requests would miss their key's day counter,
-- and the invariants checked after it would say so).
\set n random(:first, :first + :norgs - 1)
\set slot :client_id % 8
\set p random(1, :nprojects)
\set k random(1, :nkeys)
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
            created_at, stripe, project, api_key, budget_mask, budget_stripe)
    SELECT md5('bench-org-' || :n)::uuid, gen_random_uuid(), llm._period_start(now()),
           md5('bench-exec-' || :n || '-' || :slot)::uuid, 'bench-model', 'reserved', 100, 100, now(), 0,
           'project-' || :p, 'key-' || :n || '-' || :k, b.mask, pg_backend_pid() % 64
      FROM o, x, b WHERE o.status = 'operational' AND x.status = 'running'
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
