-- transactional: false
-- llm-db contract step 0021: the lean write path (issue 32), after its functions.
--
-- migrate runs a contract step once this release's functions are live and every
-- transaction that could still run the previous release's has ended (the barrier,
-- llm_db/migrate.py; docs/architecture.md Conventions 14). Then nothing writes the
-- books but this release's functions, and what they keep from now on can be
-- completed from what the previous release wrote:
--
-- 1. The mark 'functions_only': the budget counters' exact path spreads escrow rooms
--    from now on (a previous release's call would have moved a counter without them).
-- 2. Which organizations have a budget (organizations.has_budgets), and a budgets
--    revision for those that have one (their counters' rooms are spread under it).
-- 3. Each period stripe's open requests: their count, the earliest admission among
--    them, and quiet when none; one period at a time, under its stripes' locks
--    (stripe order, as every exact decision takes them), read through the previous
--    release's index of open requests.
-- 4. Each stripe's settle bounds, from its terminal requests, one organization at a
--    time, then the mark 'settle_bounds': the daily rebuild reads requests by
--    admission time from here on.
-- 5. The indexes and constraints only the previous release needed: invocations_open,
--    invocations_period and invocations_settled_at (a settlement changes no indexed
--    column after this: it is a HOT update), the counters' key without a stripe, and
--    the requests' CHECK constraints (invariant 16 checks the same, docs/contract.md).
--
-- Re-runnable from any point: each part takes up what is left (NULL columns), the
-- marks are inserted once, the drops say IF EXISTS.

INSERT INTO llm.upgrade_steps (step, finished_at) VALUES ('functions_only', pg_catalog.now())
    ON CONFLICT (step) DO NOTHING;

UPDATE llm.organizations AS o
   SET has_budgets = EXISTS (SELECT FROM llm.budget_limits AS b WHERE b.organization_id = o.id)
 WHERE o.has_budgets IS NULL
    OR o.has_budgets IS DISTINCT FROM EXISTS (SELECT FROM llm.budget_limits AS b WHERE b.organization_id = o.id);
UPDATE llm.organizations AS o
   SET budgets_revision = pg_catalog.gen_random_uuid()
 WHERE o.budgets_revision IS NULL AND o.has_budgets;

DO $$
DECLARE
    v_period record;
    v_done bigint := 0;
    v_total bigint;
BEGIN
    SELECT count(*) INTO v_total
      FROM (SELECT DISTINCT s.organization_id, s.period_start FROM llm.period_stripes AS s
             WHERE s.open_requests IS NULL) AS p;
    FOR v_period IN
        SELECT DISTINCT s.organization_id, s.period_start FROM llm.period_stripes AS s
         WHERE s.open_requests IS NULL
         ORDER BY 1, 2
    LOOP
        PERFORM llm._lock_period(v_period.organization_id, v_period.period_start);
        UPDATE llm.period_stripes AS s
           SET open_requests = coalesce(o.n, 0),
               open_since = o.since,
               quiet = coalesce(o.n, 0) = 0
          FROM llm.period_stripes AS p
          LEFT JOIN (SELECT i.stripe, count(*)::integer AS n, min(i.created_at) AS since
                       FROM llm.invocations AS i
                      WHERE i.organization_id = v_period.organization_id
                        AND i.period_start = v_period.period_start
                        AND i.status IN ('reserved', 'dispatched')
                      GROUP BY i.stripe) AS o ON o.stripe = p.stripe
         WHERE s.organization_id = v_period.organization_id AND s.period_start = v_period.period_start
           AND p.organization_id = s.organization_id AND p.period_start = s.period_start
           AND p.stripe = s.stripe;
        v_done := v_done + 1;
        RAISE NOTICE 'llm-db progress: %/%', v_done, v_total;
        COMMIT;
    END LOOP;
END
$$;

DO $$
DECLARE
    v_org uuid;
    v_done bigint := 0;
    v_total bigint;
BEGIN
    IF EXISTS (SELECT FROM llm.upgrade_steps AS u WHERE u.step = 'settle_bounds') THEN
        RETURN;
    END IF;
    SELECT count(*) INTO v_total FROM llm.organizations;
    FOR v_org IN SELECT o.id FROM llm.organizations AS o ORDER BY o.id LOOP
        UPDATE llm.period_stripes AS s
           SET settle_lag_hours = GREATEST(coalesce(s.settle_lag_hours, 0), coalesce(b.lag, 0)),
               settle_lead_hours = GREATEST(coalesce(s.settle_lead_hours, 0), coalesce(b.lead, 0))
          FROM llm.period_stripes AS p
          LEFT JOIN (SELECT i.period_start, i.stripe,
                            max(llm._hours_up(i.settled_at - i.created_at)) AS lag,
                            max(llm._hours_up(i.created_at - i.settled_at)) AS lead
                       FROM llm.invocations AS i
                      WHERE i.organization_id = v_org AND i.settled_at IS NOT NULL
                      GROUP BY i.period_start, i.stripe) AS b
            ON b.period_start = p.period_start AND b.stripe = p.stripe
         WHERE s.organization_id = v_org AND p.organization_id = v_org
           AND p.period_start = s.period_start AND p.stripe = s.stripe;
        v_done := v_done + 1;
        RAISE NOTICE 'llm-db progress: %/%', v_done, v_total;
        COMMIT;
    END LOOP;
    INSERT INTO llm.upgrade_steps (step, finished_at) VALUES ('settle_bounds', pg_catalog.now())
        ON CONFLICT (step) DO NOTHING;
END
$$;

DROP INDEX CONCURRENTLY IF EXISTS llm.invocations_open;
DROP INDEX CONCURRENTLY IF EXISTS llm.invocations_period;
DROP INDEX CONCURRENTLY IF EXISTS llm.invocations_settled_at;
ALTER TABLE llm.budget_counters DROP CONSTRAINT IF EXISTS budget_counters_key;
ALTER TABLE llm.invocations
    DROP CONSTRAINT IF EXISTS invocations_check,
    DROP CONSTRAINT IF EXISTS invocations_check1,
    DROP CONSTRAINT IF EXISTS invocations_check2,
    DROP CONSTRAINT IF EXISTS invocations_recovered_charge;
