-- transactional: false
-- llm-db contract step 0028: every notice under its new names.
--
-- After the barrier only this release's functions write notices, and they write
-- window_start and limit_credits with period_start and allowance_credits. What the
-- previous release wrote is filled here, one organization at a time (a committed
-- batch each, read through the notices' key), then a CHECK constraint makes the new
-- names equal to the old ones in every row, NOT VALID and then validated, so that no
-- reader needs the old names once 0.5.0 drops them.
--
-- Re-runnable from any point: the fill takes up the rows still NULL, the constraint
-- is added once, validating a valid one does nothing.

DO $$
DECLARE
    v_org uuid;
    v_done bigint := 0;
    v_total bigint;
BEGIN
    SELECT count(*) INTO v_total FROM llm.organizations;
    FOR v_org IN SELECT o.id FROM llm.organizations AS o ORDER BY o.id LOOP
        UPDATE llm.threshold_notices AS n
           SET window_start = n.period_start, limit_credits = n.allowance_credits
         WHERE n.organization_id = v_org
           AND (n.window_start IS NULL OR n.limit_credits IS NULL);
        v_done := v_done + 1;
        IF v_done % 1000 = 0 OR v_done = v_total THEN
            RAISE NOTICE 'llm-db progress: %/%', v_done, v_total;
        END IF;
        COMMIT;
    END LOOP;
    -- and a notice of no organization (nothing ties a notice to one), if any is left
    UPDATE llm.threshold_notices AS n
       SET window_start = n.period_start, limit_credits = n.allowance_credits
     WHERE n.window_start IS NULL OR n.limit_credits IS NULL;
END
$$;

DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_constraint AS c
                    WHERE c.conrelid = 'llm.threshold_notices'::regclass
                      AND c.conname = 'threshold_notices_names') THEN
        ALTER TABLE llm.threshold_notices ADD CONSTRAINT threshold_notices_names
            CHECK (window_start IS NOT DISTINCT FROM period_start
                   AND limit_credits IS NOT DISTINCT FROM allowance_credits) NOT VALID;
    END IF;
END
$$;

ALTER TABLE llm.threshold_notices VALIDATE CONSTRAINT threshold_notices_names;
