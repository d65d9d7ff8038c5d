-- transactional: false
-- llm-db contract step 0029: each organization's budgets on its row.
--
-- After the barrier only this release's functions change budgets, and each change
-- writes the organization's uniform budgets (migration 0029) under its row's lock.
-- What the previous release set is written here, one organization at a time, under
-- the same lock and by the same routine (_budgets_changed, which also gives the
-- organization a new budgets revision: its counters' rooms are spread again on
-- their next exact movement), each a committed transaction of its own. An
-- organization with a budget of a named id keeps them NULL, and its admissions read
-- llm.budget_limits, as before.
--
-- Re-runnable from any point: it takes up the organizations still NULL.

DO $$
DECLARE
    v_org uuid;
    v_done bigint := 0;
    v_total bigint;
BEGIN
    SELECT count(*) INTO v_total
      FROM llm.organizations AS o
     WHERE o.uniform_budget_mask IS NULL
       AND NOT EXISTS (SELECT FROM llm.budget_limits AS b WHERE b.organization_id = o.id AND b.scope_id <> '*');
    FOR v_org IN
        SELECT o.id FROM llm.organizations AS o
         WHERE o.uniform_budget_mask IS NULL
           AND NOT EXISTS (SELECT FROM llm.budget_limits AS b WHERE b.organization_id = o.id AND b.scope_id <> '*')
         ORDER BY o.id
    LOOP
        -- the lock order of every change of an organization's budgets: its row first
        PERFORM FROM llm.organizations AS o WHERE o.id = v_org FOR NO KEY UPDATE;
        PERFORM llm._budgets_changed(v_org);
        v_done := v_done + 1;
        IF v_done % 1000 = 0 OR v_done = v_total THEN
            RAISE NOTICE 'llm-db progress: %/%', v_done, v_total;
        END IF;
        COMMIT;
    END LOOP;
END
$$;
