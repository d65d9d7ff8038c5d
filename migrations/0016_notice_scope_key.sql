-- depends: 0015_budgets
-- transactional: false
-- llm-db 0016: every threshold notice names its scope and window, under a new
-- unique key (issue 23), the second expand step.
--
-- The rows older than 0015's column defaults are the allowance's: they get
-- (organization, NULL, month), in batches that commit. Then the columns are
-- made NOT NULL through a validated CHECK (no scan under the strong lock), and
-- the key one notice per (organization, scope, id, window, window start,
-- threshold) is built CONCURRENTLY, NULLS NOT DISTINCT (the allowance's id is
-- NULL). The old key (organization, period_start, threshold_pct), which the
-- previous release's functions name in ON CONFLICT, is dropped by
-- sql/70_notices.sql in the transaction that puts the new functions live.
-- Re-runnable from any point: the backfill and the CHECK take up what is left,
-- and the index is built again (a kill during a CONCURRENTLY build leaves it
-- invalid; the old key still serves until sql/ goes live).

DO $$
DECLARE
    v_done bigint := 0;
    v_batch bigint;
    v_total bigint;
BEGIN
    SELECT count(*) INTO v_total FROM llm.threshold_notices AS m
     WHERE m.scope IS NULL OR m.budget_window IS NULL;
    LOOP
        -- batched: 5000 rows per committed batch
        UPDATE llm.threshold_notices AS n
           SET scope = 'organization', budget_window = 'month'
         WHERE (n.organization_id, n.id) IN (SELECT m.organization_id, m.id FROM llm.threshold_notices AS m
                                              WHERE m.scope IS NULL OR m.budget_window IS NULL LIMIT 5000);
        GET DIAGNOSTICS v_batch = ROW_COUNT;
        EXIT WHEN v_batch = 0;
        v_done := v_done + v_batch;
        RAISE NOTICE 'llm-db progress: %/%', v_done, v_total;
        COMMIT;
    END LOOP;
END
$$;

ALTER TABLE llm.threshold_notices DROP CONSTRAINT IF EXISTS threshold_notices_scope_set;
ALTER TABLE llm.threshold_notices ADD CONSTRAINT threshold_notices_scope_set
    CHECK (scope IS NOT NULL AND budget_window IS NOT NULL) NOT VALID;
ALTER TABLE llm.threshold_notices VALIDATE CONSTRAINT threshold_notices_scope_set;
ALTER TABLE llm.threshold_notices ALTER COLUMN scope SET NOT NULL;
ALTER TABLE llm.threshold_notices ALTER COLUMN budget_window SET NOT NULL;
ALTER TABLE llm.threshold_notices DROP CONSTRAINT threshold_notices_scope_set;

DROP INDEX CONCURRENTLY IF EXISTS llm.threshold_notices_key;
CREATE UNIQUE INDEX CONCURRENTLY threshold_notices_key ON llm.threshold_notices
    (organization_id, scope, scope_id, budget_window, period_start, threshold_pct) NULLS NOT DISTINCT;
