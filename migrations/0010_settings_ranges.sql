-- depends: 0009_periods_view_for_citus
-- llm-db 0010: every setting has a range.
--
-- 1. A setting only had to be positive, and some positive values broke every
--    sweep: recovery_window = '100000 years' made every organization fail with
--    22008 (issue 20 defect 10). Each setting now has a documented range
--    (docs/operations.md, "Settings"), enforced by a CHECK constraint named
--    settings_<setting>_range, so the 23514 of an UPDATE out of range names the
--    setting. A value already out of range stops this migration with 23514
--    naming the setting, its value and its range; nothing is changed.
--
-- Under live traffic: llm.settings is one row, locked only for this short
-- transaction (every sweep and notice call reads it, so the recount of the
-- sweeps' totals is 0012, a transaction of its own).

-- One statement (a DO block): the ranges are added NOT VALID, the row is checked
-- against each, then each is validated, with no savepoint between DDL statements
-- (see 0005). The ranges are written once, in the constraints; the check reads them.
DO $ranges$
DECLARE
    v_range record;
    v_value text;
    v_ok boolean;
BEGIN
    ALTER TABLE llm.settings
        DROP CONSTRAINT settings_recovery_window_check,
        DROP CONSTRAINT settings_drift_window_check,
        DROP CONSTRAINT settings_sweep_batch_check,
        DROP CONSTRAINT settings_reporting_days_check,
        DROP CONSTRAINT settings_health_max_age_check,
        DROP CONSTRAINT settings_notice_claim_timeout_check,
        DROP CONSTRAINT settings_notice_backoff_base_check,
        DROP CONSTRAINT settings_notice_backoff_max_check,
        DROP CONSTRAINT settings_org_lock_timeout_check,
        DROP CONSTRAINT settings_org_time_budget_check,
        DROP CONSTRAINT settings_pass_lease_check,
        -- windows a clock of the years 1 .. 9999 can step back by without overflow
        ADD CONSTRAINT settings_recovery_window_range
            CHECK (recovery_window > interval '0' AND recovery_window <= interval '365 days') NOT VALID,
        ADD CONSTRAINT settings_drift_window_range
            CHECK (drift_window > interval '0' AND drift_window <= interval '365 days') NOT VALID,
        -- reconcile_org's own p_batch range
        ADD CONSTRAINT settings_sweep_batch_range
            CHECK (sweep_batch BETWEEN 1 AND 100000) NOT VALID,
        -- a pass rebuilds at most 35 days of daily usage (llm._rebuild_days)
        ADD CONSTRAINT settings_reporting_days_range
            CHECK (reporting_days BETWEEN 1 AND 35) NOT VALID,
        ADD CONSTRAINT settings_health_max_age_range
            CHECK (health_max_age > interval '0' AND health_max_age <= interval '30 days') NOT VALID,
        ADD CONSTRAINT settings_notice_claim_timeout_range
            CHECK (notice_claim_timeout > interval '0' AND notice_claim_timeout <= interval '1 day') NOT VALID,
        -- the backoff multiplies the base by up to 2^29: at most an hour stays an interval
        ADD CONSTRAINT settings_notice_backoff_base_range
            CHECK (notice_backoff_base > interval '0' AND notice_backoff_base <= interval '1 hour') NOT VALID,
        ADD CONSTRAINT settings_notice_backoff_max_range
            CHECK (notice_backoff_max > interval '0' AND notice_backoff_max <= interval '30 days') NOT VALID,
        -- becomes lock_timeout, whose own limit is about 24 days
        ADD CONSTRAINT settings_org_lock_timeout_range
            CHECK (org_lock_timeout > interval '0' AND org_lock_timeout <= interval '1 hour') NOT VALID,
        ADD CONSTRAINT settings_org_time_budget_range
            CHECK (org_time_budget > interval '0' AND org_time_budget <= interval '1 day') NOT VALID,
        ADD CONSTRAINT settings_pass_lease_range
            CHECK (pass_lease > interval '0' AND pass_lease <= interval '1 day') NOT VALID;

    FOR v_range IN
        SELECT c.conname, a.attname, pg_catalog.pg_get_expr(c.conbin, c.conrelid) AS expr
          FROM pg_catalog.pg_constraint AS c
          JOIN pg_catalog.pg_attribute AS a ON a.attrelid = c.conrelid AND a.attnum = c.conkey[1]
         WHERE c.conrelid = 'llm.settings'::regclass AND c.conname LIKE 'settings\_%\_range'
         ORDER BY a.attnum
    LOOP
        EXECUTE pg_catalog.format('SELECT s.%I::text, %s FROM llm.settings AS s', v_range.attname, v_range.expr)
           INTO v_value, v_ok;
        IF NOT v_ok THEN
            RAISE EXCEPTION 'llm: setting % is %, outside its range', v_range.attname, v_value
                USING ERRCODE = '23514', SCHEMA = 'llm', TABLE = 'settings', COLUMN = v_range.attname,
                      CONSTRAINT = v_range.conname,
                      DETAIL = pg_catalog.format('The range of %s: %s.', v_range.attname, v_range.expr),
                      HINT = pg_catalog.format('Set it in range (UPDATE llm.settings SET %I = ...), then migrate again; docs/operations.md, "Settings".',
                                               v_range.attname);
        END IF;
        EXECUTE pg_catalog.format('ALTER TABLE llm.settings VALIDATE CONSTRAINT %I', v_range.conname);
    END LOOP;
END
$ranges$;

COMMENT ON TABLE llm.settings IS
    'One row of tunables: recovery window, drift window, sweep batch, reporting days, health max age, notice timing, the bounds of a pass. Each has a range (constraint settings_<setting>_range; docs/operations.md, "Settings"); change them with a plain UPDATE as the owner.';
